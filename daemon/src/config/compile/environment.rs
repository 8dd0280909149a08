//! The last compile step: checks against the machine, run in the same pass as every
//! other check so `qd check-config` lists all problems at once, not one kind per
//! run after the file itself is clean. It reads the API
//! token file (exists, owner-only mode, valid, names only configured queues),
//! checks the database password file (exists, owner-only mode), resolves
//! `admin_group`, and builds each queue's executor (header names, env
//! names, NUL bytes, the HTTP client), skipping keys already reported broken.

use std::collections::BTreeMap;

use super::super::diag::{Diagnostics, KeyPath};
use super::super::{DaemonConfig, QueueConfig};
use crate::executor::{Executor, ExecutorError};

/// Records a problem for each of the checks above that fails.
pub(super) fn check(
    diag: &mut Diagnostics<'_>,
    daemon: &DaemonConfig,
    queues: &BTreeMap<String, QueueConfig>,
) {
    let at = |key: &str| KeyPath::of(&["daemon", key]);
    if let Some(path) = &daemon.api_tokens_file
        && !diag.is_broken(&at("api_tokens_file"))
        && let Err(e) = crate::api::auth::Tokens::load(path, |q| queues.contains_key(q))
    {
        diag.error(&at("api_tokens_file"), e.to_string());
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
        && let Err(e) = crate::admin_server::resolve_group(group)
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
        match Executor::new(&queue.executor) {
            Ok(_) => {}
            Err(ExecutorError::Invalid { key, reason }) => {
                diag.error(&path, format!("{key}: {reason}"));
            }
            Err(e) => diag.error(&path, e.to_string()),
        }
    }
}
