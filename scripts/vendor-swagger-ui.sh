#!/usr/bin/env bash
# Re-vendor Swagger UI from the npm registry into assets/swagger-ui/.
#
#   scripts/vendor-swagger-ui.sh [VERSION]     (default: the version pinned below)
#
# Copies only swagger-ui-bundle.js, swagger-ui.css and LICENSE, verifies the
# tarball against the registry's sha512 integrity, and rewrites the README.
# The files are embedded into the binary and served under /docs/.
set -euo pipefail

VERSION="${1:-5.35.0}"
PKG="swagger-ui-dist"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/assets/swagger-ui"

command -v npm >/dev/null || { echo "npm is required" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

INTEGRITY="$(npm view "$PKG@$VERSION" dist.integrity)"
if [[ -z "$INTEGRITY" ]]; then
  echo "no such version: $PKG@$VERSION" >&2
  exit 1
fi

(cd "$WORK" && npm pack --silent "$PKG@$VERSION" >/dev/null)
TARBALL="$WORK/$PKG-$VERSION.tgz"
[[ -f "$TARBALL" ]] || { echo "npm pack did not produce $TARBALL" >&2; exit 1; }

# Verify the tarball against the registry's integrity string.
ACTUAL="sha512-$(openssl dgst -sha512 -binary "$TARBALL" | base64 -w0)"
if [[ "$ACTUAL" != "$INTEGRITY" ]]; then
  echo "integrity mismatch: expected $INTEGRITY, got $ACTUAL" >&2
  exit 1
fi

tar -xzf "$TARBALL" -C "$WORK"
mkdir -p "$DEST"
for f in swagger-ui-bundle.js swagger-ui.css LICENSE; do
  [[ -f "$WORK/package/$f" ]] || { echo "missing $f in $PKG@$VERSION" >&2; exit 1; }
  cp "$WORK/package/$f" "$DEST/$f"
done

cat > "$DEST/README.md" <<README
Vendored from the npm package \`$PKG@$VERSION\` (Apache-2.0, see LICENSE), integrity \`$INTEGRITY\`.
Only \`swagger-ui-bundle.js\`, \`swagger-ui.css\` and \`LICENSE\` are kept; they are embedded in the binary and served at \`/docs/\`.
To refresh or change version: \`scripts/vendor-swagger-ui.sh <version>\` (then update the default version in that script).
README

echo "vendored $PKG@$VERSION into $DEST:"
ls -l "$DEST"
