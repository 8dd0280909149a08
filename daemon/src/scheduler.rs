//! Per-queue dispatch. `scheduler/fair.rs` is the pure weighted fair queue.

pub mod fair;
