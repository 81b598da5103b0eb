//! A circuit breaker for Redis: once calls fail, further calls fail at once
//! for a cooldown instead of each waiting out the command timeout; then one
//! call goes through as a probe, and its success closes the breaker again.
//!
//! States: closed (calls go through; `failures_to_open` failures in a row
//! open it), open (calls are refused until the cooldown ends), half-open
//! (one probe is in flight; other calls are refused until it ends). A probe
//! dropped before it finished counts as a failure, so the breaker never
//! waits for a probe that will not come back.
//!
//! Must not: know about Redis commands or retry anything.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen,
}

#[derive(Debug)]
struct Inner {
    state: State,
    /// The last failure or refusal: what a cache must not trust before.
    last_trouble: Option<Instant>,
}

#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Inner>,
    failures_to_open: u32,
    cooldown: Duration,
}

/// The right to make one call; say how it went with `success` or
/// `failure`. Dropped unanswered, it counts as a failure.
pub struct Permit<'a> {
    breaker: &'a Breaker,
    answered: bool,
}

impl Permit<'_> {
    pub fn success(mut self) {
        self.answered = true;
        self.breaker.record(true);
    }

    pub fn failure(mut self) {
        self.answered = true;
        self.breaker.record(false);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.breaker.record(false);
        }
    }
}

impl Breaker {
    pub fn new(failures_to_open: u32, cooldown: Duration) -> Breaker {
        Breaker {
            inner: Mutex::new(Inner { state: State::Closed { failures: 0 }, last_trouble: None }),
            failures_to_open: failures_to_open.max(1),
            cooldown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every change leaves the state consistent, so a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A permit for one call, or None when the call must fail at once.
    pub fn admit(&self) -> Option<Permit<'_>> {
        let mut inner = self.lock();
        let now = Instant::now();
        match inner.state {
            State::Closed { .. } => {}
            State::Open { until } if now >= until => inner.state = State::HalfOpen,
            State::Open { .. } | State::HalfOpen => {
                inner.last_trouble = Some(now);
                return None;
            }
        }
        Some(Permit { breaker: self, answered: false })
    }

    /// Whether calls are refused right now (without taking a permit).
    pub fn is_open(&self) -> bool {
        match self.lock().state {
            State::Closed { .. } => false,
            State::Open { until } => Instant::now() < until,
            State::HalfOpen => true,
        }
    }

    /// Whether a call failed or was refused within `window` (or the breaker
    /// is not closed): what was cached before may be stale.
    pub fn troubled_within(&self, window: Duration) -> bool {
        let inner = self.lock();
        !matches!(inner.state, State::Closed { .. }) || inner.last_trouble.is_some_and(|t| t.elapsed() < window)
    }

    fn record(&self, ok: bool) {
        let mut inner = self.lock();
        let now = Instant::now();
        if ok {
            inner.state = State::Closed { failures: 0 };
            return;
        }
        inner.last_trouble = Some(now);
        inner.state = match inner.state {
            State::Closed { failures } if failures + 1 < self.failures_to_open => {
                State::Closed { failures: failures + 1 }
            }
            _ => State::Open { until: now + self.cooldown },
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_refuses_then_probes_once_and_closes_on_success() {
        let b = Breaker::new(2, Duration::from_millis(30));
        b.admit().unwrap().failure();
        assert!(!b.is_open());
        b.admit().unwrap().failure();
        assert!(b.is_open());
        assert!(b.admit().is_none());
        std::thread::sleep(Duration::from_millis(40));
        let probe = b.admit().expect("the probe after the cooldown");
        assert!(b.admit().is_none(), "one probe at a time");
        probe.success();
        assert!(!b.is_open());
        assert!(b.admit().is_some());
        assert!(b.troubled_within(Duration::from_secs(60)));
        assert!(!b.troubled_within(Duration::ZERO));
    }

    #[test]
    fn a_dropped_probe_reopens() {
        let b = Breaker::new(1, Duration::from_millis(10));
        b.admit().unwrap().failure();
        std::thread::sleep(Duration::from_millis(20));
        drop(b.admit().unwrap());
        assert!(b.is_open());
    }
}
