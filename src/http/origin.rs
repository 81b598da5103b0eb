//! Keyless mode's guard against web pages. A server without API keys trusts
//! whoever reaches it, and a browser on the same machine reaches it for any
//! page it opens: a page could post to it cross-site, or rebind its own
//! domain's DNS to 127.0.0.1 and read the answers as same-origin. Such
//! requests name the page's host in `Host` (rebinding) or `Origin` (cross-site),
//! so a keyless server answers only requests whose `Host`, and `Origin` when
//! sent, name localhost, 127.0.0.1, [::1] or a configured host.
//!
//! With keys nothing is checked: a page cannot read a visitor's key, and a
//! server behind a proxy answers whatever name the proxy uses. The probes
//! (`/healthz`, `/readyz`) answer any host: they reveal nothing, and
//! orchestrators address them by IP.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::app::AppState;
use crate::error::ApiError;

/// Paths answered whatever the host.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

pub async fn guard_keyless(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if state.auth.is_open()
        && !PROBES.contains(&req.uri().path())
        && let Err(e) = check(&state, &req)
    {
        return e.into_response();
    }
    next.run(req).await
}

fn check(state: &AppState, req: &Request) -> Result<(), ApiError> {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).or_else(|| req.uri().host());
    let Some(host) = host else {
        return Err(ApiError::HostNotAllowed("the request has no Host header".into()));
    };
    if !state.auth.host_allowed(host_name(host)) {
        return Err(ApiError::HostNotAllowed(format!(
            "this server has no API keys and answers only requests to localhost, 127.0.0.1, [::1] \
             or a host in auth.allowed_hosts, not to `{}`",
            shown(host)
        )));
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let text = origin.to_str().unwrap_or("");
        let allowed = origin_host(text).is_some_and(|h| state.auth.host_allowed(h));
        if !allowed {
            return Err(ApiError::OriginNotAllowed(format!(
                "this server has no API keys and answers no web page from origin `{}`; \
                 only pages on localhost, 127.0.0.1, [::1] or a host in auth.allowed_hosts",
                shown(text)
            )));
        }
    }
    Ok(())
}

/// The host of a `Host` value (`name`, `name:port`, `[v6]:port`), without the port.
pub fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => authority,
    }
}

/// The host of an `Origin` value (`scheme://host[:port]`); None for `null`
/// (sandboxed frames, files) and anything else that is not an origin.
fn origin_host(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    (!authority.is_empty()).then(|| host_name(authority))
}

/// A client-supplied value, cut short for an error message.
fn shown(value: &str) -> String {
    value.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lose_their_port() {
        assert_eq!(host_name("localhost:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8080"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("evil.example"), "evil.example");
    }

    #[test]
    fn origins_give_their_host() {
        assert_eq!(origin_host("http://localhost:3000"), Some("localhost"));
        assert_eq!(origin_host("https://[::1]"), Some("[::1]"));
        assert_eq!(origin_host("http://evil.example"), Some("evil.example"));
        assert_eq!(origin_host("null"), None);
        assert_eq!(origin_host("http://"), None);
    }
}
