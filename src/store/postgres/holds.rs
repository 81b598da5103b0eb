//! Legal holds on Postgres (migration 0008): the rows, the per-user
//! advisory lock that serialises placing a hold with accepting an erasure,
//! and the condition the retention sweep's queries add to leave held rows
//! alone. The transaction-side primitives are called from `erasure.rs`'s
//! `ErasureTx` implementation.
//!
//! Must not: decide what a hold stops (`domain::holds`, `store::erasure`).

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use super::{PgStore, store_error};
use crate::domain::holds::Hold;
use crate::store::StoreResult;

/// True for a row (alias `m`) whose user has no active hold: added to every
/// query of the retention sweep, through the `legal_holds_active` index.
pub(super) const NOT_HELD: &str = "NOT EXISTS (SELECT 1 FROM legal_holds h \
    WHERE h.tenant_id = m.tenant_id AND h.user_id = m.user_id AND h.released_at IS NULL)";

const HOLD_COLUMNS: &str = "id, tenant_id, user_id, reason, placed_by, placed_at, released_by, released_at";

type HoldTuple = (Uuid, String, String, Option<String>, String, DateTime<Utc>, Option<String>, Option<DateTime<Utc>>);

fn hold_of((id, tenant, user_id, reason, placed_by, placed_at, released_by, released_at): HoldTuple) -> Hold {
    Hold { id, tenant, user_id, reason, placed_by, placed_at, released_by, released_at }
}

/// One advisory lock per (tenant, user), in the order given. The key is a
/// 64-bit hash of both, length-prefixed so that no two pairs share a text;
/// two pairs sharing a hash only wait for each other, which is safe.
pub(super) async fn lock_users(conn: &mut PgConnection, tenant: &str, users: &[String]) -> StoreResult<()> {
    for user in users {
        sqlx::query(
            "SELECT pg_advisory_xact_lock(hashtextextended('legal_hold:' || length($1) || ':' || $1 || $2, 0))",
        )
        .bind(tenant)
        .bind(user)
        .execute(&mut *conn)
        .await
        .map_err(store_error)?;
    }
    Ok(())
}

pub(super) async fn active_holds(conn: &mut PgConnection, tenant: &str, users: &[String]) -> StoreResult<Vec<Hold>> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<HoldTuple> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT {HOLD_COLUMNS} FROM legal_holds WHERE tenant_id = $1 AND user_id = ANY($2) AND released_at IS NULL \
         ORDER BY placed_at, id"
    )))
    .bind(tenant)
    .bind(users)
    .fetch_all(conn)
    .await
    .map_err(store_error)?;
    Ok(rows.into_iter().map(hold_of).collect())
}

/// Unfinished erasures naming the user, or holding claims on rows of it
/// (the claim keeps the row's user: the row itself is deleted on acceptance).
pub(super) async fn erasures_of_user(conn: &mut PgConnection, tenant: &str, user_id: &str) -> StoreResult<Vec<Uuid>> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT e.id FROM erasures e WHERE e.tenant_id = $1 AND e.state IN ('pending', 'running', 'retrying') \
         AND (e.selector::jsonb ->> 'user_id' = $2 \
              OR EXISTS (SELECT 1 FROM erasure_items i WHERE i.tenant_id = $1 AND i.erasure_id = e.id \
                         AND i.user_id = $2)) \
         ORDER BY e.requested_at, e.id",
    )
    .bind(tenant)
    .bind(user_id)
    .fetch_all(conn)
    .await
    .map_err(store_error)?;
    Ok(ids)
}

pub(super) async fn insert_hold(conn: &mut PgConnection, h: &Hold) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO legal_holds (id, tenant_id, user_id, reason, placed_by, placed_at, released_by, released_at, \
         created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $6, $6)",
    )
    .bind(h.id)
    .bind(&h.tenant)
    .bind(&h.user_id)
    .bind(&h.reason)
    .bind(&h.placed_by)
    .bind(h.placed_at)
    .bind(&h.released_by)
    .bind(h.released_at)
    .execute(conn)
    .await
    .map_err(store_error)?;
    Ok(())
}

pub(super) async fn hold_for_update(conn: &mut PgConnection, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>> {
    let row: Option<HoldTuple> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT {HOLD_COLUMNS} FROM legal_holds WHERE tenant_id = $1 AND id = $2 FOR UPDATE"
    )))
    .bind(tenant)
    .bind(id)
    .fetch_optional(conn)
    .await
    .map_err(store_error)?;
    Ok(row.map(hold_of))
}

pub(super) async fn save_release(conn: &mut PgConnection, h: &Hold) -> StoreResult<()> {
    sqlx::query(
        "UPDATE legal_holds SET released_by = $3, released_at = $4, updated_at = $4 \
         WHERE tenant_id = $1 AND id = $2",
    )
    .bind(&h.tenant)
    .bind(h.id)
    .bind(&h.released_by)
    .bind(h.released_at)
    .execute(conn)
    .await
    .map_err(store_error)?;
    Ok(())
}

impl PgStore {
    pub async fn hold(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>> {
        let row: Option<HoldTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {HOLD_COLUMNS} FROM legal_holds WHERE tenant_id = $1 AND id = $2"
        )))
        .bind(tenant)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(row.map(hold_of))
    }

    pub async fn tenant_holds(&self, tenant: &str, user_id: Option<&str>) -> StoreResult<Vec<Hold>> {
        let rows: Vec<HoldTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {HOLD_COLUMNS} FROM legal_holds WHERE tenant_id = $1 AND ($2::text IS NULL OR user_id = $2) \
             AND released_at IS NULL ORDER BY placed_at, id"
        )))
        .bind(tenant)
        .bind(user_id)
        .fetch_all(&self.pool)
        .await
        .map_err(store_error)?;
        Ok(rows.into_iter().map(hold_of).collect())
    }
}
