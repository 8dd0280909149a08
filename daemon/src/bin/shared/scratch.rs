//! A scratch directory for the runners beside qd (`qd-scenarios`, `qd-bench`):
//! where they put the configs, data dirs, logs and scripts of the servers they
//! start (removed when dropped), and the free loopback ports those listen on.

use std::path::PathBuf;

use anyhow::{Context, Result};

/// `N` distinct free TCP ports on loopback. Each pick is held until all are made:
/// two picks one after the other may return the same port, and a qd whose API and
/// metrics ports are equal cannot start. Errors: no port could be bound.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let held = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("bind a free port"))
        .collect::<Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&held) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

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
