//! Which jobs a pass of the Pruner covers ([`PruneScope`]), engine-neutral: the
//! states a prune deletes are [`super::contract::Intent::Prune`]'s, and each engine
//! picks one bounded batch with its own statements (SQLite: `store/sqlite/prune.rs`;
//! PostgreSQL: its `prune_finished`; the model: in memory). Each engine deletes a
//! picked job with its payload and history. The Pruner actor repeats batches until
//! one comes back short. Takes no messages.

use crate::job::Job;

/// Which queues' jobs a prune covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PruneScope {
    /// The jobs of one (configured) queue, pruned at that queue's retention.
    Queue(String),
    /// The jobs of every queue *not* in this list: queues removed from the config,
    /// whose finished jobs would otherwise stay forever.
    Unconfigured(Vec<String>),
}

impl PruneScope {
    /// Whether `job` belongs to this scope.
    pub fn covers(&self, job: &Job) -> bool {
        match self {
            PruneScope::Queue(q) => *job.queue == **q,
            PruneScope::Unconfigured(known) => !known.iter().any(|q| *job.queue == **q),
        }
    }
}
