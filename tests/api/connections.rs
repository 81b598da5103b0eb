//! Connections as a hostile or careless client uses them: sockets that never
//! send headers, kept-alive sockets left idle, more sockets than the server
//! keeps, and a client that writes a whole rejected body before it reads.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, spawn_app_with};

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://")).await.expect("server accepts")
}

/// Reads until the server closes the connection (end of file or reset), for
/// at most `within`; returns what was read, or None if it was still open.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read_all).await.ok()?;
    Some(got)
}

#[tokio::test]
async fn a_connection_that_never_sends_headers_is_closed_after_the_header_timeout() {
    let app = spawn_app_with(|c| {
        c.server.header_read_timeout_ms = 300;
        c.server.keep_alive_timeout_ms = 300;
    })
    .await;
    let mut silent = connect(&app).await;
    let started = Instant::now();
    let closed = read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "a silent connection was still open after 5 s");
    assert!(started.elapsed() >= Duration::from_millis(250), "closed after {:?}", started.elapsed());
}

#[tokio::test]
async fn a_kept_alive_connection_left_idle_is_closed_after_the_keep_alive_timeout() {
    let app = spawn_app_with(|c| {
        c.server.header_read_timeout_ms = 10_000;
        c.server.keep_alive_timeout_ms = 300;
    })
    .await;
    let mut conn = connect(&app).await;
    conn.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = conn.read(&mut buf).await.unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answered = Instant::now();
    // Closed by the keep-alive timeout, well before the header-read timeout.
    assert!(read_until_closed(&mut conn, Duration::from_secs(5)).await.is_some(), "still open after 5 s");
    let idle = answered.elapsed();
    assert!(idle >= Duration::from_millis(250) && idle < Duration::from_secs(5), "closed after {idle:?}");
}

#[tokio::test]
async fn idle_connections_beyond_the_limit_are_closed_and_healthz_still_answers() {
    let limit = 8;
    let app = spawn_app_with(|c| c.server.max_connections = limit).await;
    let mut idle = Vec::new();
    for _ in 0..5 * limit {
        idle.push(connect(&app).await);
    }
    let health = tokio::time::timeout(Duration::from_secs(5), app.get("/healthz")).await;
    assert_eq!(health.expect("/healthz answered within 5 s").status(), StatusCode::OK);
    // Every idle socket the server made room by closing reads as closed; at
    // most `limit` are still open (the /healthz connection took one place).
    let mut open = 0;
    for conn in &mut idle {
        if read_until_closed(conn, Duration::from_millis(200)).await.is_none() {
            open += 1;
        }
    }
    assert!(open < limit, "{open} idle connections still open, limit {limit}");
}

#[tokio::test]
async fn a_client_that_writes_a_whole_oversized_body_before_reading_gets_the_413_body() {
    let app = spawn_app_with(|_| {}).await;
    let body = vec![b' '; 10 * 1024 * 1024];
    let mut conn = connect(&app).await;
    let head = format!(
        "POST /v1/memories HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    // Like Python's requests: the whole request first, then the response.
    conn.write_all(head.as_bytes()).await.expect("headers written");
    conn.write_all(&body).await.expect("the whole body written without a reset");
    let response = read_until_closed(&mut conn, Duration::from_secs(10)).await.expect("response within 10 s");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    let json = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(json).expect("the error body is JSON");
    assert_eq!(json["error"]["code"], "payload_too_large", "{json}");
}
