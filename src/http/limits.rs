//! Per-key request limits: a rate (a token bucket per key, from `governor`)
//! and a number of requests in flight, so that one client cannot take the
//! server from the others. Both answer 429 `rate_limited` with Retry-After.
//!
//! The key is the bearer token as sent (hashed, never kept in clear), so a
//! limit holds per API key whether or not the key is valid; requests without
//! a key (the keyless mode, which listens on loopback) share one key.
//! Defaults are generous: one client sending requests one after another
//! never reaches them (`config/default.toml`, `[limits]`).
//!
//! Must not: decide who the caller is (authentication does), or hold a
//! request's slot after its response.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::LimitsConfig;
use crate::error::ApiError;

/// The limits of every key, shared by all requests.
pub struct Limits {
    rate: Option<DefaultKeyedRateLimiter<[u8; 16]>>,
    in_flight: usize,
    /// Per key: its slots for requests in flight (a key with none in flight
    /// is dropped from the map, so the map holds only busy keys).
    slots: Mutex<HashMap<[u8; 16], Arc<Semaphore>>>,
}

impl Limits {
    pub fn new(config: &LimitsConfig) -> Limits {
        let rate = NonZeroU32::new(config.requests_per_second).map(|per_second| {
            let burst = NonZeroU32::new(config.burst).unwrap_or(per_second);
            RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst))
        });
        Limits { rate, in_flight: config.concurrent_requests, slots: Mutex::new(HashMap::new()) }
    }

    /// Takes one request of `key`: a slot in flight (held until the
    /// response), or the seconds to wait.
    fn admit(self: &Arc<Self>, key: [u8; 16]) -> Result<Option<Slot>, u64> {
        if let Some(rate) = &self.rate
            && let Err(not_until) = rate.check_key(&key)
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(wait.as_secs_f64().ceil().max(1.0) as u64);
        }
        if self.in_flight == 0 {
            return Ok(None);
        }
        let semaphore = {
            let mut slots = self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            slots.entry(key).or_insert_with(|| Arc::new(Semaphore::new(self.in_flight))).clone()
        };
        match semaphore.try_acquire_owned() {
            Ok(permit) => Ok(Some(Slot { limits: self.clone(), key, _permit: Some(permit) })),
            Err(_) => Err(1),
        }
    }
}

/// A request's slot; given back (and the key forgotten when idle) on drop.
struct Slot {
    limits: Arc<Limits>,
    key: [u8; 16],
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self._permit.take());
        let mut slots = self.limits.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if slots.get(&self.key).is_some_and(|s| s.available_permits() == self.limits.in_flight) {
            slots.remove(&self.key);
        }
    }
}

/// The limit key of a request: a digest of its Authorization header.
fn key_of(req: &Request) -> [u8; 16] {
    let digest = Sha256::digest(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()).unwrap_or_default());
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// Answers 429 when the request's key is over its rate or has too many
/// requests in flight; otherwise runs it, holding a slot until it is answered.
pub async fn limit(limits: Arc<Limits>, req: Request, next: Next) -> Response {
    match limits.admit(key_of(&req)) {
        Ok(slot) => {
            let response = next.run(req).await;
            drop(slot);
            response
        }
        Err(retry_after_secs) => ApiError::RateLimited { retry_after_secs }.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(requests_per_second: u32, burst: u32, concurrent_requests: usize) -> Arc<Limits> {
        Arc::new(Limits::new(&LimitsConfig { requests_per_second, burst, concurrent_requests }))
    }

    #[test]
    fn a_key_past_its_burst_waits_and_other_keys_do_not() {
        let l = limits(1, 3, 0);
        for _ in 0..3 {
            assert!(l.admit([1; 16]).is_ok());
        }
        // One a second after the burst: the next waits about a second.
        assert_eq!(l.admit([1; 16]).err(), Some(1));
        assert!(l.admit([2; 16]).is_ok());
    }

    #[test]
    fn requests_in_flight_are_counted_per_key_until_answered() {
        let l = limits(0, 0, 2);
        let first = l.admit([1; 16]).unwrap();
        let second = l.admit([1; 16]).unwrap();
        assert_eq!(l.admit([1; 16]).err(), Some(1));
        assert!(l.admit([2; 16]).is_ok(), "another key has slots of its own");
        drop(first);
        let third = l.admit([1; 16]).unwrap();
        drop((second, third));
        // An idle key is forgotten.
        assert!(l.slots.lock().unwrap().is_empty());
    }

    #[test]
    fn zero_turns_each_limit_off() {
        let l = limits(0, 0, 0);
        for _ in 0..10_000 {
            assert!(l.admit([1; 16]).unwrap().is_none());
        }
    }
}
