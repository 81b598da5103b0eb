//! Sharing's primitives on Postgres (`store::share`): grants, teams and the
//! copies found by their provenance (migration 0010).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::retention::PERSISTENT;
use super::rows::{self, MemoryRow};
use super::{PgStore, store_error};
use crate::domain::Memory;
use crate::domain::share::{Grant, GrantTarget, Teams};
use crate::store::StoreResult;
use crate::store::share::{Copies, Sharing};

type GrantTuple = (Uuid, String, Option<Vec<String>>, Option<String>, String, DateTime<Utc>, Option<DateTime<Utc>>);

fn grant_of((id, from_agent_id, agents, team, created_by, created_at, revoked_at): GrantTuple) -> Grant {
    let target = match (agents, team) {
        (Some(agents), _) => GrantTarget::Agents(agents),
        (None, team) => GrantTarget::Team(team.unwrap_or_default()),
    };
    Grant { id, from_agent_id, target, created_by, created_at, revoked_at }
}

const GRANT_COLUMNS: &str = "id, from_agent_id, to_agent_ids, team, created_by, created_at, revoked_at";

#[async_trait]
impl Sharing for PgStore {
    async fn grants(&self, tenant: &str) -> StoreResult<Vec<Grant>> {
        let rows: Vec<GrantTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {GRANT_COLUMNS} FROM share_grants WHERE tenant_id = $1 ORDER BY created_at, id"
        )))
        .bind(tenant)
        .fetch_all(self.pool())
        .await
        .map_err(store_error)?;
        Ok(rows.into_iter().map(grant_of).collect())
    }

    async fn insert_grant(&self, tenant: &str, g: &Grant) -> StoreResult<()> {
        let (agents, team) = match &g.target {
            GrantTarget::Agents(a) => (Some(a.clone()), None),
            GrantTarget::Team(t) => (None, Some(t.clone())),
        };
        sqlx::query(
            "INSERT INTO share_grants (id, tenant_id, from_agent_id, to_agent_ids, team, created_by, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(g.id)
        .bind(tenant)
        .bind(&g.from_agent_id)
        .bind(agents)
        .bind(team)
        .bind(&g.created_by)
        .bind(g.created_at)
        .execute(self.pool())
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn revoke_grant(&self, tenant: &str, id: Uuid, by: &str, at: DateTime<Utc>) -> StoreResult<Option<Grant>> {
        let row: Option<GrantTuple> = sqlx::query_as(AssertSqlSafe(format!(
            "UPDATE share_grants SET revoked_at = coalesce(revoked_at, $3), revoked_by = coalesce(revoked_by, $4) \
             WHERE tenant_id = $1 AND id = $2 RETURNING {GRANT_COLUMNS}"
        )))
        .bind(tenant)
        .bind(id)
        .bind(at)
        .bind(by)
        .fetch_optional(self.pool())
        .await
        .map_err(store_error)?;
        Ok(row.map(grant_of))
    }

    async fn teams(&self, tenant: &str) -> StoreResult<Teams> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT team, agent_id FROM share_teams WHERE tenant_id = $1 ORDER BY team, agent_id")
                .bind(tenant)
                .fetch_all(self.pool())
                .await
                .map_err(store_error)?;
        let mut teams = Teams::new();
        for (team, agent) in rows {
            teams.entry(team).or_default().insert(agent);
        }
        Ok(teams)
    }

    async fn set_team(&self, tenant: &str, team: &str, agents: &[String]) -> StoreResult<()> {
        let mut tx = self.pool().begin().await.map_err(store_error)?;
        sqlx::query("DELETE FROM share_teams WHERE tenant_id = $1 AND team = $2")
            .bind(tenant)
            .bind(team)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        sqlx::query(
            "INSERT INTO share_teams (tenant_id, team, agent_id) SELECT $1, $2, a FROM unnest($3::text[]) AS a \
             ON CONFLICT DO NOTHING",
        )
        .bind(tenant)
        .bind(team)
        .bind(agents)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)
    }

    async fn copies(
        &self,
        tenant: &str,
        which: Copies<'_>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Memory>> {
        let (filter, value) = match which {
            Copies::Into(agent) => ("agent_id = $2", agent.to_string()),
            Copies::From(agent) => ("provenance->>'source_agent_id' = $2", agent.to_string()),
            Copies::Grant(id) => ("provenance->>'grant_id' = $2", id.to_string()),
        };
        let sql = PERSISTENT
            .iter()
            .map(|t| {
                format!(
                    "(SELECT {} FROM {} WHERE tenant_id = $1 AND provenance IS NOT NULL AND {filter} \
                     AND (expires_at IS NULL OR expires_at > $3) ORDER BY created_at DESC LIMIT $4)",
                    rows::columns(*t),
                    rows::table(*t)
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let found: Vec<MemoryRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT * FROM ({sql}) c ORDER BY created_at DESC, id DESC LIMIT $4"
        )))
        .bind(tenant)
        .bind(value)
        .bind(now)
        .bind(limit as i64)
        .fetch_all(self.pool())
        .await
        .map_err(store_error)?;
        found.into_iter().map(Memory::try_from).collect()
    }
}
