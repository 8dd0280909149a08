//! Weighted fair choice between tenants within one queue.

/// What a tenant's share is measured in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fairness {
    /// Each dispatched job costs 1.
    #[default]
    Jobs,
    /// Each job costs its measured run time, charged when it ends.
    Runtime,
}
