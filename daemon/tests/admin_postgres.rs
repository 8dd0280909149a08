//! `admin.rs` with qd on PostgreSQL (the harness picks the backend from this binary's
//! name: `common::on_postgres`).

#[path = "admin.rs"]
mod admin;
