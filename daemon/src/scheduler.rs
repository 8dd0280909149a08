//! Per-queue dispatch. `scheduler/fair.rs` is the pure weighted fair queue;
//! `scheduler/delayed.rs` is the pure min-heap of delayed jobs by due time.

pub mod delayed;
pub mod fair;
