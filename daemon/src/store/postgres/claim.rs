//! The PostgreSQL claims: taking leases of given jobs ([`PgBackend::claim_until`]),
//! of the next jobs of a queue ([`claim_next_as`]), within tenants' concurrency
//! caps across nodes ([`claim_capped_as`], an advisory lock per capped queue and
//! tenant) and the look at what any node may claim ([`claimable`]). Rows another
//! node is claiming are skipped (`FOR UPDATE SKIP LOCKED`), never waited for.
//! Takes no messages: the writer thread calls it through [`PgBackend`]'s
//! [`crate::store::SharedStore`] implementation.

use std::collections::HashMap;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{JOB_COLUMNS, PgBackend, has_duplicates, job_from_row, millis, stored_seq, uuids};
use crate::job::{Job, JobId};
use crate::store::contract::Intent;
use crate::store::{Claim, LeaseKind, NewClaim, StoreError, TenantCap};

/// The seed of the advisory lock keys of tenants' caps: a (queue, tenant)'s key is
/// `hashtextextended(queue || chr(1) || tenant, CAP_LOCK_SEED)`. Two pairs that
/// share a key only serialise each other's claims. ("qdcap" in ASCII.)
const CAP_LOCK_SEED: i64 = 0x0071_6463_6170;

impl PgBackend {
    /// How many more jobs each of `caps` (queue, tenant, cap) may have leased now,
    /// across every node, inside the open transaction: 0 for a pair another
    /// transaction holds the advisory lock of (it is claiming for that tenant; not
    /// waited for, so two nodes' group commits never wait on each other). The
    /// lock, once taken, is held until this transaction ends, so no other node
    /// claims for the pair meanwhile. The count is a statement of its own, after
    /// the lock's: its snapshot then shows every claim committed before the lock
    /// was free (one statement's snapshot would predate its lock). The two are
    /// pipelined: one round trip.
    pub(super) fn allowances(
        &mut self,
        caps: &[(&str, &str, u32)],
    ) -> Result<Vec<u32>, StoreError> {
        if caps.is_empty() {
            return Ok(Vec::new());
        }
        let queues: Vec<&str> = caps.iter().map(|c| c.0).collect();
        let tenants: Vec<&str> = caps.iter().map(|c| c.1).collect();
        let (locked, counts) = self.block(async |c| {
            let lock = c
                .prepare_cached(&format!(
                    "SELECT pg_try_advisory_xact_lock(\
                       hashtextextended(p.queue || chr(1) || p.tenant, {CAP_LOCK_SEED})) \
                     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY \
                       AS p(queue, tenant, n) ORDER BY p.n"
                ))
                .await?;
            let count = c
                .prepare_cached(
                    "SELECT (SELECT count(*) FROM qd_jobs j WHERE j.queue = p.queue \
                       AND j.tenant = p.tenant AND j.lease_token IS NOT NULL) \
                     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY \
                       AS p(queue, tenant, n) ORDER BY p.n",
                )
                .await?;
            let args: [&(dyn ToSql + Sync); 2] = [&queues, &tenants];
            tokio::try_join!(c.query(&lock, &args), c.query(&count, &args))
        })?;
        Ok(caps
            .iter()
            .zip(locked.iter().zip(&counts))
            .map(|(cap, (locked, count))| {
                if !locked.get::<_, bool>(0) {
                    return 0;
                }
                let leased = u64::try_from(count.get::<_, i64>(0)).unwrap_or(0);
                u32::try_from(u64::from(cap.2).saturating_sub(leased)).unwrap_or(0)
            })
            .collect())
    }

    /// Takes leases stored until `lease` or `node_timeout` from now by the database
    /// clock, whichever is later (see the module doc); see [`Backend::claim`].
    /// Rows another transaction holds are skipped, not waited for (`FOR UPDATE SKIP
    /// LOCKED`): a claim never waits on another node, so two nodes' batches cannot
    /// deadlock on each other's claims; a skipped job is answered as not claimed.
    pub(super) fn claim_until(
        &mut self,
        leased: &[Job],
        lease: Duration,
        kind: LeaseKind,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if leased.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<JobId> = leased.iter().map(|j| j.id).collect();
        if has_duplicates(&ids) {
            return leased
                .iter()
                .map(|job| {
                    Ok(self
                        .claim_until(std::slice::from_ref(job), lease, kind)?
                        .remove(0))
                })
                .collect();
        }
        let uuids = uuids(&ids);
        let tokens: Vec<i64> = leased.iter().map(|j| stored_seq(j.lease_seq)).collect();
        let workers: Vec<String> = leased
            .iter()
            .map(|j| j.worker.clone().unwrap_or_default())
            .collect();
        let at: Vec<i64> = leased
            .iter()
            .map(|j| j.leased_at.unwrap_or(j.updated_at))
            .collect();
        let lease_ms = millis(lease.max(self.options.node_timeout));
        let end_ms = (kind == LeaseKind::External).then(|| millis(lease));
        let (node, id) = (self.options.node.clone(), self.options.node_id);
        let rows = self.block(async |c| {
            let stmt = c
                .prepare_cached(&format!(
                    "WITH c AS (\
                       SELECT * FROM unnest($1::uuid[], $2::int8[], $3::text[], $4::int8[]) \
                         AS c(id, token, worker, leased_at)), \
                     locked AS (\
                       SELECT j.id FROM qd_jobs j JOIN c ON j.id = c.id \
                       WHERE {} \
                         AND j.lease_token IS NULL AND j.lease_seq < c.token \
                         AND EXISTS (SELECT 1 FROM qd_nodes n \
                           WHERE n.name = $6 AND n.node_id = $7) \
                       ORDER BY j.id FOR UPDATE OF j SKIP LOCKED), \
                     claimed AS (\
                       UPDATE qd_jobs j SET lease_seq = c.token, lease_token = c.token, \
                         worker = c.worker, leased_at = c.leased_at, lease_node = $6, \
                         lease_deadline = now() + $5::int8 * interval '1 millisecond', \
                         lease_end = now() + $8::int8 * interval '1 millisecond' \
                       FROM c WHERE j.id = c.id AND j.id IN (SELECT id FROM locked) \
                       RETURNING j.id) \
                     SELECT p.job_id, p.body FROM claimed JOIN qd_payloads p \
                       ON p.job_id = claimed.id",
                    Intent::Claim.sql("j.state")
                ))
                .await?;
            c.query(
                &stmt,
                &[
                    &uuids, &tokens, &workers, &at, &lease_ms, &node, &id, &end_ms,
                ],
            )
            .await
        })?;
        let mut bodies: HashMap<Uuid, Vec<u8>> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(uuids.iter().map(|id| bodies.remove(id)).collect())
    }
}

pub(super) fn claimable(
    pg: &mut PgBackend,
    queues: &[String],
    per_queue: u32,
) -> Result<Vec<Job>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM unnest($1::text[]) AS q(name) CROSS JOIN LATERAL (\
           SELECT * FROM qd_jobs c WHERE c.queue = q.name \
             AND {} AND c.lease_token IS NULL \
           ORDER BY c.ready_at - c.priority_ms, c.id LIMIT $2) j",
        Intent::Claim.sql("c.state")
    );
    let limit = i64::from(per_queue);
    pg.query_jobs(&sql, &[&queues, &limit])
}

pub(super) fn claim_next_as(
    pg: &mut PgBackend,
    next: &NewClaim<'_>,
    kind: LeaseKind,
) -> Result<Vec<(Job, Vec<u8>)>, StoreError> {
    let lease_ms = millis(next.lease.max(pg.options.node_timeout));
    let end_ms = (kind == LeaseKind::External).then(|| millis(next.lease));
    let limit = match (next.cap, next.tenant) {
        (None, _) => next.limit,
        (Some(cap), Some(tenant)) => next
            .limit
            .min(pg.allowances(&[(next.queue, tenant, cap)])?[0]),
        (Some(_), None) => {
            return Err(StoreError::Other(
                "claim_next: a concurrency cap needs a tenant".into(),
            ));
        }
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    let limit = i64::from(limit);
    let (node, id) = (pg.options.node.clone(), pg.options.node_id);
    let claimable = Intent::Claim.sql("state");
    let sql = format!(
        "WITH picked AS (\
           SELECT id FROM qd_jobs \
           WHERE queue = $1 AND {claimable} AND ready_at <= $2 \
             AND lease_token IS NULL AND ($8::text IS NULL OR tenant = $8) \
             AND EXISTS (SELECT 1 FROM qd_nodes n WHERE n.name = $7 AND n.node_id = $9) \
           ORDER BY ready_at - priority_ms, id LIMIT $3 FOR UPDATE SKIP LOCKED), \
         claimed AS (\
           UPDATE qd_jobs j SET lease_seq = j.lease_seq + 1, lease_token = j.lease_seq + 1, \
             worker = $4, leased_at = $5, lease_node = $7, \
             lease_deadline = now() + $6::int8 * interval '1 millisecond', \
             lease_end = now() + $10::int8 * interval '1 millisecond' \
           FROM picked WHERE j.id = picked.id RETURNING j.*) \
         SELECT {JOB_COLUMNS}, p.body FROM claimed j JOIN qd_payloads p ON p.job_id = j.id \
         ORDER BY j.ready_at - j.priority_ms, j.id"
    );
    let rows = pg.block(async |c| {
        let stmt = c.prepare_cached(&sql).await?;
        c.query(
            &stmt,
            &[
                &next.queue,
                &next.now,
                &limit,
                &next.worker,
                &next.now,
                &lease_ms,
                &node,
                &next.tenant,
                &id,
                &end_ms,
            ],
        )
        .await
    })?;
    rows.iter()
        .map(|r| Ok((job_from_row(r, &pg.target)?, r.get(16))))
        .collect()
}

/// See the trait and the module doc (tenants' caps). A job whose tenant has a
/// cap counts against its allowance whether or not its claim then applies.
pub(super) fn claim_capped_as(
    pg: &mut PgBackend,
    leased: &[Job],
    lease: Duration,
    caps: &[TenantCap],
    kind: LeaseKind,
) -> Result<Vec<Claim>, StoreError> {
    let cap_of = |job: &Job| {
        caps.iter()
            .position(|c| c.queue == job.queue && c.tenant == job.tenant)
    };
    // The caps that apply to these jobs, each once, in order of first use.
    let mut used: Vec<usize> = Vec::new();
    for k in leased.iter().filter_map(cap_of) {
        if !used.contains(&k) {
            used.push(k);
        }
    }
    if used.is_empty() {
        let claimed = pg.claim_until(leased, lease, kind)?;
        return Ok(claimed.into_iter().map(Claim::from).collect());
    }
    let pairs: Vec<(&str, &str, u32)> = used
        .iter()
        .map(|&k| (&*caps[k].queue, &*caps[k].tenant, caps[k].max))
        .collect();
    let mut left = pg.allowances(&pairs)?;
    let mut refused = vec![false; leased.len()];
    for (job, refused) in leased.iter().zip(&mut refused) {
        let Some(k) = cap_of(job) else { continue };
        let slot = used.iter().position(|u| *u == k).map(|i| &mut left[i]);
        match slot {
            Some(n) if *n > 0 => *n -= 1,
            _ => *refused = true,
        }
    }
    let granted: Vec<Job> = leased
        .iter()
        .zip(&refused)
        .filter(|(_, r)| !**r)
        .map(|(j, _)| j.clone())
        .collect();
    let mut claimed = pg.claim_until(&granted, lease, kind)?.into_iter();
    Ok(refused
        .iter()
        .map(|refused| match refused {
            true => Claim::AtCap,
            false => claimed.next().map_or(Claim::Lost, Claim::from),
        })
        .collect())
}
