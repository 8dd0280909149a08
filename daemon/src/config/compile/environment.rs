//! The last compile step: checks against the machine, run in the same pass as every
//! other check so `qd check-config` lists all problems at once, not one kind per
//! run after the file itself is clean. It has the caller's [`MachineChecks`] read
//! the API token file and resolve `admin_group`, checks the database password
//! file (exists, owner-only mode), and has each queue's executor built, skipping
//! keys already reported broken.

use std::collections::BTreeMap;

use super::super::diag::{Diagnostics, KeyPath};
use super::super::{DaemonConfig, MachineChecks, QueueConfig};

/// Records a problem for each of the checks above that fails.
pub(super) fn check(
    diag: &mut Diagnostics<'_>,
    machine: &dyn MachineChecks,
    daemon: &DaemonConfig,
    queues: &BTreeMap<String, QueueConfig>,
) {
    let at = |key: &str| KeyPath::of(&["daemon", key]);
    if let Some(path) = &daemon.api_tokens_file
        && !diag.is_broken(&at("api_tokens_file"))
        && let Err(e) = machine.token_file(path, &|q| queues.contains_key(q))
    {
        diag.error(&at("api_tokens_file"), e);
    }
    if let Some(path) = daemon
        .database
        .as_ref()
        .and_then(|d| d.password_file.as_ref())
        && !diag.is_broken(&at("database_password_file"))
        && let Err(e) = super::super::database::check_password_file(path)
    {
        diag.error(&at("database_password_file"), e);
    }
    if let Some(group) = &daemon.admin_group
        && let Err(e) = machine.admin_group(group)
    {
        diag.error(
            &at("admin_group"),
            format!("{e}; create the group or change the key"),
        );
    }
    for (name, queue) in queues {
        let path = KeyPath::of(&["queues", name, "executor"]);
        if diag.touches_broken(&path) {
            continue;
        }
        if let Err(e) = machine.executor(&queue.executor) {
            diag.error(&path, e);
        }
    }
}
