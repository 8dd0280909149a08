//! How a change to the SQS-created queues (`qd_sqs_queues`, written by
//! [`crate::store::Backend::set_sqs_queue`]) reaches every node at once: the
//! write's transaction also sends `NOTIFY qd_sqs_queues` with the writing node's
//! name, so the announcement is delivered at its commit and never for a write
//! that rolled back. Each node's Cluster actor listens on the channel and has its
//! Supervisor apply the table (`SupervisorMsg::SqsQueuesChanged`); the writing
//! node applied its own change already and skips its own announcements. The
//! Cluster heartbeat compares the table with the queues in force, for a node
//! whose notification connection was down.
//!
//! Takes no messages: the writer thread calls it through [`super::PgBackend`].

use deadpool_postgres::ClientWrapper;

/// The channel on which a change to the SQS-created queues is announced; the
/// payload is the name of the node that wrote it.
pub const SQS_QUEUES_CHANNEL: &str = "qd_sqs_queues";

/// Announces, at the commit of the open transaction, that `node` changed the
/// SQS-created queues.
pub(super) async fn announce(c: &ClientWrapper, node: &str) -> Result<(), tokio_postgres::Error> {
    let stmt = c.prepare_cached("SELECT pg_notify($1, $2)").await?;
    c.execute(&stmt, &[&SQS_QUEUES_CHANNEL, &node])
        .await
        .map(drop)
}
