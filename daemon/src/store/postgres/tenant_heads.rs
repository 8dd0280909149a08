//! The oldest claimable jobs of every backlogged tenant of a queue, for a node
//! whose look at a queue's oldest jobs ([`crate::store::SharedStore::claimable`])
//! was cut off by its window: without them, a tenant whose jobs are all newer
//! than the window and were accepted on another node stays invisible to this
//! node, which then serves only the others and the weights fail across the
//! cluster. The tenants come from the tenant depth counters (`qd_tenant_depths`),
//! each tenant's jobs from an index in its claim order, so a look costs a few
//! index reads per tenant whatever the backlog.
//!
//! Takes no messages: the writer thread calls it through [`super::PgBackend`].

use super::{JOB_COLUMNS, PgBackend};
use crate::job::Job;
use crate::store::StoreError;

/// A queue's tenants' jobs in their claim order, for [`heads`]: one more index
/// entry per job while it is ready or delayed (the claim-order index's twin with
/// the tenant in front).
pub(super) const TENANT_CLAIM_ORDER: &str = r#"
CREATE INDEX qd_jobs_tenant_claim_order ON qd_jobs (queue, tenant, (ready_at - priority_ms), id)
    WHERE state IN ('ready', 'delayed');
"#;

/// [`crate::store::SharedStore::tenant_heads`]: the oldest claimable jobs (ready
/// or delayed, no lease) of each tenant with unfinished jobs in each of `queues`,
/// in claim order: `per_tenant` of each, fewer when the queue has more than
/// `most / per_tenant` such tenants (`most` shared among them, at least one each),
/// so every backlogged tenant is seen whatever their number.
pub(super) fn heads(
    pg: &mut PgBackend,
    queues: &[String],
    per_tenant: u32,
    most: u32,
) -> Result<Vec<Job>, StoreError> {
    let sql = format!(
        "SELECT {JOB_COLUMNS} FROM unnest($1::text[]) AS q(name) CROSS JOIN LATERAL (\
           WITH t AS (\
             SELECT tenant FROM qd_tenant_depths d WHERE d.queue = q.name \
             GROUP BY tenant HAVING sum(depth) > 0), \
           n AS (SELECT GREATEST(1, LEAST($2, $3 / GREATEST(count(*), 1)))::int8 AS each FROM t) \
           SELECT h.* FROM t CROSS JOIN n CROSS JOIN LATERAL (\
             SELECT * FROM qd_jobs c WHERE c.queue = q.name AND c.tenant = t.tenant \
               AND c.state IN ('ready', 'delayed') AND c.lease_token IS NULL \
             ORDER BY c.ready_at - c.priority_ms, c.id LIMIT n.each) h) j"
    );
    let (per_tenant, most) = (i64::from(per_tenant), i64::from(most));
    pg.query_jobs(&sql, &[&queues, &per_tenant, &most])
}
