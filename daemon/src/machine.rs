//! The checks against the machine that the config asks for when it is loaded for
//! `qd run`, `qd check-config` and a reload ([`crate::config::MachineChecks`]):
//! the API token file, the admin socket's group and each queue's executor. They
//! live here, above `config`, because they use the API's token parser, the admin
//! socket and the executors; `config` itself imports none of them.

use std::path::Path;

use crate::config::MachineChecks;
use crate::executor::{Executor, ExecutorError, ExecutorSpec};

/// The checks of this machine, as `qd` runs them.
pub struct Machine;

impl MachineChecks for Machine {
    fn token_file(&self, path: &Path, known_queue: &dyn Fn(&str) -> bool) -> Result<(), String> {
        crate::api::auth::Tokens::load(path, known_queue)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn admin_group(&self, group: &str) -> Result<(), String> {
        crate::admin_server::resolve_group(group)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    fn executor(&self, spec: &ExecutorSpec) -> Result<(), String> {
        match Executor::new(spec) {
            Ok(_) => Ok(()),
            Err(ExecutorError::Invalid { key, reason }) => Err(format!("{key}: {reason}")),
            Err(e) => Err(e.to_string()),
        }
    }
}
