//! Sharing's primitives on SQLite (`store::share`): grants, teams and the
//! copies found by their provenance (migration 0009).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;
use uuid::Uuid;

use super::rows::{COLUMNS, MemoryRow};
use super::{SqliteStore, from_micros, micros, store_error};
use crate::domain::Memory;
use crate::domain::share::{Grant, GrantTarget, Teams};
use crate::store::share::{Copies, Sharing};
use crate::store::{StoreError, StoreResult, corrupt};

type GrantTuple = (Uuid, String, Option<String>, Option<String>, String, i64, Option<i64>);

fn grant_of((id, from_agent_id, agents, team, created_by, created_at, revoked_at): GrantTuple) -> StoreResult<Grant> {
    let target = match (agents, team) {
        (Some(agents), _) => {
            GrantTarget::Agents(serde_json::from_str(&agents).map_err(|_| corrupt("to_agent_ids", &agents))?)
        }
        (None, team) => GrantTarget::Team(team.unwrap_or_default()),
    };
    Ok(Grant {
        id,
        from_agent_id,
        target,
        created_by,
        created_at: from_micros(created_at)?,
        revoked_at: revoked_at.map(from_micros).transpose()?,
    })
}

const GRANT_COLUMNS: &str = "id, from_agent_id, to_agent_ids, team, created_by, created_at, revoked_at";

#[async_trait]
impl Sharing for SqliteStore {
    async fn grants(&self, tenant: &str) -> StoreResult<Vec<Grant>> {
        let rows: Vec<GrantTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select {GRANT_COLUMNS} from share_grants where tenant_id = ? order by created_at, id"
        )))
        .bind(tenant)
        .fetch_all(&self.inner.pool)
        .await
        .map_err(store_error)?;
        rows.into_iter().map(grant_of).collect()
    }

    async fn insert_grant(&self, tenant: &str, g: &Grant) -> StoreResult<()> {
        let (agents, team) = match &g.target {
            GrantTarget::Agents(a) => {
                (Some(serde_json::to_string(a).map_err(|e| StoreError::Internal(e.into()))?), None)
            }
            GrantTarget::Team(t) => (None, Some(t.clone())),
        };
        let _gate = self.inner.write_gate.lock().await;
        sqlx::query(
            "insert into share_grants (id, tenant_id, from_agent_id, to_agent_ids, team, created_by, created_at) \
             values (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(g.id)
        .bind(tenant)
        .bind(&g.from_agent_id)
        .bind(agents)
        .bind(team)
        .bind(&g.created_by)
        .bind(micros(g.created_at))
        .execute(&self.inner.pool)
        .await
        .map_err(store_error)?;
        Ok(())
    }

    async fn revoke_grant(&self, tenant: &str, id: Uuid, by: &str, at: DateTime<Utc>) -> StoreResult<Option<Grant>> {
        let _gate = self.inner.write_gate.lock().await;
        let row: Option<GrantTuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "update share_grants set revoked_at = coalesce(revoked_at, ?3), revoked_by = coalesce(revoked_by, ?4) \
             where tenant_id = ?1 and id = ?2 returning {GRANT_COLUMNS}"
        )))
        .bind(tenant)
        .bind(id)
        .bind(micros(at))
        .bind(by)
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(store_error)?;
        row.map(grant_of).transpose()
    }

    async fn teams(&self, tenant: &str) -> StoreResult<Teams> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("select team, agent_id from share_teams where tenant_id = ? order by team, agent_id")
                .bind(tenant)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(store_error)?;
        let mut teams = Teams::new();
        for (team, agent) in rows {
            teams.entry(team).or_default().insert(agent);
        }
        Ok(teams)
    }

    async fn set_team(&self, tenant: &str, team: &str, agents: &[String]) -> StoreResult<()> {
        let _gate = self.inner.write_gate.lock().await;
        let mut tx = self.inner.pool.begin().await.map_err(store_error)?;
        sqlx::query("delete from share_teams where tenant_id = ? and team = ?")
            .bind(tenant)
            .bind(team)
            .execute(&mut *tx)
            .await
            .map_err(store_error)?;
        for agent in agents {
            sqlx::query("insert into share_teams (tenant_id, team, agent_id) values (?, ?, ?) on conflict do nothing")
                .bind(tenant)
                .bind(team)
                .bind(agent)
                .execute(&mut *tx)
                .await
                .map_err(store_error)?;
        }
        tx.commit().await.map_err(store_error)
    }

    async fn copies(
        &self,
        tenant: &str,
        which: Copies<'_>,
        now: DateTime<Utc>,
        limit: usize,
    ) -> StoreResult<Vec<Memory>> {
        let mut qb = QueryBuilder::new(format!("select {COLUMNS} from memories m where m.provenance is not null"));
        qb.push(" and m.tenant_id = ").push_bind(tenant.to_string());
        match which {
            Copies::Into(agent) => qb.push(" and m.agent_id = ").push_bind(agent.to_string()),
            Copies::From(agent) => {
                qb.push(" and json_extract(m.provenance, '$.source_agent_id') = ").push_bind(agent.to_string())
            }
            Copies::Grant(id) => qb.push(" and json_extract(m.provenance, '$.grant_id') = ").push_bind(id.to_string()),
        };
        qb.push(" and (m.expires_at is null or m.expires_at > ").push_bind(micros(now)).push(")");
        qb.push(" order by m.created_at desc, m.id desc limit ").push_bind(limit as i64);
        let rows: Vec<MemoryRow> = qb.build_query_as().fetch_all(&self.inner.pool).await.map_err(store_error)?;
        rows.into_iter().map(Memory::try_from).collect()
    }
}
