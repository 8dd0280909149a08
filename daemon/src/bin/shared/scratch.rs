//! A scratch directory for the runners beside qd (`qd-scenarios`, `qd-bench`):
//! where they put the configs, data dirs, logs and scripts of the servers they
//! start. Removed when dropped.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// A scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh directory under the system temp dir, named `qd-{what}-{uuid}`.
    pub fn new(what: &str) -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("qd-{what}-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(Scratch(dir))
    }

    /// Writes an executable `sh` script named `name`; returns its path.
    pub fn script(&self, name: &str, body: &str) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.0.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
