//! Legal holds on the embedded backend (migration 0008): the rows, and the
//! condition the retention sweep's queries add to leave held rows alone.
//! Every write transaction runs behind the write gate, so placing a hold,
//! accepting an erasure and each sweep batch never overlap: no lock of
//! their own is needed. The transaction-side primitives are called from
//! `erasure.rs`'s `ErasureTx` implementation.
//!
//! Must not: decide what a hold stops (`domain::holds`, `store::erasure`).

use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::{SqliteStore, from_micros, micros, store_error};
use crate::domain::holds::Hold;
use crate::store::StoreResult;

/// True for a row of `memories` whose user has no active hold, through the
/// `legal_holds_active` index.
pub(super) const NOT_HELD: &str = "not exists (select 1 from legal_holds h \
    where h.tenant_id = memories.tenant_id and h.user_id = memories.user_id and h.released_at is null)";

const HOLD_COLUMNS: &str = "id, tenant_id, user_id, reason, placed_by, placed_at, released_by, released_at";

type HoldTuple = (Uuid, String, String, Option<String>, String, i64, Option<String>, Option<i64>);

fn hold_of(
    (id, tenant, user_id, reason, placed_by, placed_at, released_by, released_at): HoldTuple,
) -> StoreResult<Hold> {
    Ok(Hold {
        id,
        tenant,
        user_id,
        reason,
        placed_by,
        placed_at: from_micros(placed_at)?,
        released_by,
        released_at: released_at.map(from_micros).transpose()?,
    })
}

pub(super) async fn active_holds(
    conn: &mut SqliteConnection,
    tenant: &str,
    users: &[String],
) -> StoreResult<Vec<Hold>> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let mut qb: QueryBuilder<Sqlite> =
        QueryBuilder::new(format!("select {HOLD_COLUMNS} from legal_holds where tenant_id = "));
    qb.push_bind(tenant.to_string()).push(" and released_at is null and user_id in (");
    let mut list = qb.separated(", ");
    for u in users {
        list.push_bind(u.clone());
    }
    list.push_unseparated(") order by placed_at, id");
    let rows: Vec<HoldTuple> = qb.build_query_as().fetch_all(conn).await.map_err(store_error)?;
    rows.into_iter().map(hold_of).collect()
}

/// Unfinished erasures naming the user, or holding claims on rows of it.
pub(super) async fn erasures_of_user(
    conn: &mut SqliteConnection,
    tenant: &str,
    user_id: &str,
) -> StoreResult<Vec<Uuid>> {
    sqlx::query_scalar(
        "select e.id from erasures e where e.tenant_id = ?1 and e.state in ('pending', 'running', 'retrying') \
         and (json_extract(e.selector, '$.user_id') = ?2 \
              or exists (select 1 from erasure_items i join memories m on m.tenant_id = i.tenant_id and m.id = i.id \
                         where i.tenant_id = ?1 and i.erasure_id = e.id and m.user_id = ?2)) \
         order by e.requested_at, e.id",
    )
    .bind(tenant)
    .bind(user_id)
    .fetch_all(conn)
    .await
    .map_err(store_error)
}

pub(super) async fn insert_hold(conn: &mut SqliteConnection, h: &Hold) -> StoreResult<()> {
    sqlx::query(
        "insert into legal_holds (id, tenant_id, user_id, reason, placed_by, placed_at, released_by, released_at, \
         created_at, updated_at) values (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?6, ?6)",
    )
    .bind(h.id)
    .bind(&h.tenant)
    .bind(&h.user_id)
    .bind(&h.reason)
    .bind(&h.placed_by)
    .bind(micros(h.placed_at))
    .bind(&h.released_by)
    .bind(h.released_at.map(micros))
    .execute(conn)
    .await
    .map_err(store_error)?;
    Ok(())
}

/// A hold (the transaction holds the write gate, so nothing else changes it).
pub(super) async fn hold_in(conn: &mut SqliteConnection, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>> {
    let row: Option<HoldTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {HOLD_COLUMNS} from legal_holds where tenant_id = ? and id = ?"
    )))
    .bind(tenant)
    .bind(id)
    .fetch_optional(conn)
    .await
    .map_err(store_error)?;
    row.map(hold_of).transpose()
}

pub(super) async fn save_release(conn: &mut SqliteConnection, h: &Hold) -> StoreResult<()> {
    sqlx::query(
        "update legal_holds set released_by = ?3, released_at = ?4, updated_at = ?4 where tenant_id = ?1 and id = ?2",
    )
    .bind(&h.tenant)
    .bind(h.id)
    .bind(&h.released_by)
    .bind(h.released_at.map(micros))
    .execute(conn)
    .await
    .map_err(store_error)?;
    Ok(())
}

impl SqliteStore {
    pub async fn hold(&self, tenant: &str, id: Uuid) -> StoreResult<Option<Hold>> {
        let mut conn = self.inner.pool.acquire().await.map_err(store_error)?;
        hold_in(&mut conn, tenant, id).await
    }

    pub async fn tenant_holds(&self, tenant: &str, user_id: Option<&str>) -> StoreResult<Vec<Hold>> {
        let rows: Vec<HoldTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {HOLD_COLUMNS} from legal_holds where tenant_id = ?1 and (?2 is null or user_id = ?2) \
             and released_at is null order by placed_at, id"
        )))
        .bind(tenant)
        .bind(user_id)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(hold_of).collect()
    }
}
