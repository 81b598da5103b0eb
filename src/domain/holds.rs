//! Legal holds: a hold on a user of a tenant keeps that user's memories
//! from being destroyed while it is active.
//!
//! Rules, all decided here and used by every backend and job:
//! - **What a hold protects**: every persistent memory whose `user_id` is
//!   the held user, in every tier, whatever its agent. Working memory (a
//!   session scratchpad with a time to live) is outside holds, and so are
//!   memories without a user (no hold can name them).
//! - **What it stops**: an erasure that would touch a held user's memory,
//!   by user or by memory id, including what the erasure would follow to
//!   (superseded versions, derived facts), is refused naming the holds; the
//!   retention sweep (expiry and decay), its dry run and its backlog leave
//!   held memories out. Reads still hide expired memories: a hold keeps
//!   data, it does not bring it back into recall.
//! - **When**: a hold is active from its placement until its release. A
//!   released hold stays on record; releasing it again changes nothing.
//!   The next sweep after a release deletes what expired meanwhile.
//! - **Against an erasure already accepted**: placing a hold is refused
//!   while an unfinished erasure names the user or has claimed rows of it;
//!   the erasure was acknowledged to its requester and is not undone.
//!
//! Must not: know where holds are stored or how the sweeps filter them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::validate::{self, FieldError};

/// Longest reason, in characters.
pub const MAX_REASON_CHARS: usize = 1000;

/// The audit operations of holds.
pub const PLACED: &str = "legal_hold_placed";
pub const RELEASED: &str = "legal_hold_released";

/// A hold as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub id: Uuid,
    pub tenant: String,
    pub user_id: String,
    pub reason: Option<String>,
    /// The id of the API key that placed it (`keyless` without keys).
    pub placed_by: String,
    pub placed_at: DateTime<Utc>,
    pub released_by: Option<String>,
    pub released_at: Option<DateTime<Utc>>,
}

impl Hold {
    /// A new active hold, its times rounded to the microsecond (what both
    /// databases keep, so the response and a later read agree).
    pub fn new(tenant: &str, user_id: String, reason: Option<String>, actor: &str, now: DateTime<Utc>) -> Hold {
        Hold {
            id: Uuid::now_v7(),
            tenant: tenant.to_string(),
            user_id,
            reason,
            placed_by: actor.to_string(),
            placed_at: to_micros(now),
            released_by: None,
            released_at: None,
        }
    }

    pub fn is_active(&self) -> bool {
        self.released_at.is_none()
    }

    /// The hold released by `actor` at `now` (unchanged when it already was).
    pub fn released(mut self, actor: &str, now: DateTime<Utc>) -> Hold {
        if self.is_active() {
            self.released_by = Some(actor.to_string());
            self.released_at = Some(to_micros(now));
        }
        self
    }
}

fn to_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Checks a hold as a request gives it: the user is an identifier, the
/// reason (when given) storable text of at most [`MAX_REASON_CHARS`].
pub fn validate(user_id: &str, reason: Option<&str>) -> Result<(), FieldError> {
    validate::identifier("/user_id", user_id)?;
    if let Some(reason) = reason {
        validate::short_text("/reason", reason, MAX_REASON_CHARS)?;
    }
    Ok(())
}

/// The message of a refused erasure: every hold that stands in its way.
pub fn refusal(holds: &[Hold]) -> String {
    let named: Vec<String> = holds.iter().map(|h| format!("{} (user {:?})", h.id, h.user_id)).collect();
    format!(
        "the erasure would touch memories under legal hold: {}; release the hold first (DELETE /v1/holds/{{id}})",
        named.join(", ")
    )
}

/// Users whose active holds an erasure must check: the subject's user, and
/// every user of a row it selected or followed to (rows without a user
/// cannot be held). Sorted and without repeats, the order locks are taken in.
pub fn users_touched<'a>(
    subject_user: Option<&'a str>,
    row_users: impl IntoIterator<Item = Option<&'a str>>,
) -> Vec<String> {
    let mut users: Vec<String> =
        subject_user.into_iter().chain(row_users.into_iter().flatten()).map(String::from).collect();
    users.sort();
    users.dedup();
    users
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn a_hold_is_released_once_and_keeps_its_first_release() {
        let at = |s: u32| Utc.with_ymd_and_hms(2026, 5, 1, 0, 0, s).unwrap();
        let h = Hold::new("t", "alice".into(), None, "ops", at(0));
        assert!(h.is_active());
        let r = h.released("ops", at(1));
        assert_eq!((r.released_by.as_deref(), r.released_at), (Some("ops"), Some(at(1))));
        let again = r.clone().released("other", at(2));
        assert_eq!(again, r);
    }

    #[test]
    fn reasons_and_users_are_checked_by_field() {
        assert!(validate("alice", Some("case 12")).is_ok());
        assert_eq!(validate("", None).unwrap_err().field, "/user_id");
        assert_eq!(validate("alice", Some(&"x".repeat(MAX_REASON_CHARS + 1))).unwrap_err().field, "/reason");
        assert!(validate("alice", Some(&"é".repeat(MAX_REASON_CHARS))).is_ok(), "characters, not bytes");
        assert_eq!(validate("alice", Some("a\0b")).unwrap_err().field, "/reason");
    }

    #[test]
    fn the_users_an_erasure_touches_are_sorted_once_each_without_the_userless() {
        let users = users_touched(Some("bob"), [Some("alice"), None, Some("bob"), Some("alice")]);
        assert_eq!(users, ["alice", "bob"]);
        assert!(users_touched(None, [None]).is_empty());
    }
}
