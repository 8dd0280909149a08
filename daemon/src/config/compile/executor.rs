//! Compiling `executor = { kind = ..., ... }` into [`ExecutorSpec`], checking
//! what can be checked before the first job: the program exists, is a regular
//! file and is executable; `cwd` is a directory; the URL is http(s); headers
//! and environment variables are well formed; exit codes are not contradictory.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use super::super::diag::{Diagnostics, KeyPath};
use super::super::raw::{ExecutorKind, RawExecutor, RawExitCodes};
use super::resolve;
use crate::executor::spec::{CommandSpec, ErrorClass, ExecutorSpec, ExitCodes, HttpSpec};

/// The queue's limits, copied into the executor settings.
pub(crate) struct Limits {
    /// The queue's `timeout`.
    pub timeout: Duration,
    /// The queue's `kill_grace`.
    pub kill_grace: Duration,
}

/// Compiles one executor at `path` (`queues.Q.executor`); `None` if unusable.
pub(crate) fn compile(
    diag: &mut Diagnostics<'_>,
    path: &KeyPath,
    raw: &RawExecutor,
    base_dir: &Path,
    limits: Limits,
) -> Option<ExecutorSpec> {
    reject_foreign_keys(diag, path, raw);
    match raw.kind {
        ExecutorKind::Command => {
            command(diag, path, raw, base_dir, limits).map(ExecutorSpec::Command)
        }
        ExecutorKind::Http => http(diag, path, raw, limits).map(ExecutorSpec::Http),
        ExecutorKind::External => Some(ExecutorSpec::External),
    }
}

fn kind_name(kind: ExecutorKind) -> &'static str {
    match kind {
        ExecutorKind::Command => "command",
        ExecutorKind::Http => "http",
        ExecutorKind::External => "external",
    }
}

/// Keys given for a kind that does not use them are errors, not silently ignored.
fn reject_foreign_keys(diag: &mut Diagnostics<'_>, path: &KeyPath, raw: &RawExecutor) {
    let command = [
        ("program", raw.program.is_some()),
        ("args", raw.args.is_some()),
        ("env", raw.env.is_some()),
        ("cwd", raw.cwd.is_some()),
        ("exit_codes", raw.exit_codes.is_some()),
    ];
    let http = [
        ("url", raw.url.is_some()),
        ("headers", raw.headers.is_some()),
        ("store_result", raw.store_result.is_some()),
        ("send_parents", raw.send_parents.is_some()),
    ];
    let foreign: Vec<&str> = match raw.kind {
        ExecutorKind::Command => given(&http),
        ExecutorKind::Http => given(&command),
        ExecutorKind::External => [given(&command), given(&http)].concat(),
    };
    for key in foreign {
        diag.error(
            &path.join(&[key]),
            format!("`{key}` is not used by kind = \"{}\"", kind_name(raw.kind)),
        );
    }
}

fn given<'k>(keys: &[(&'k str, bool)]) -> Vec<&'k str> {
    keys.iter().filter(|(_, g)| *g).map(|(k, _)| *k).collect()
}

fn command(
    diag: &mut Diagnostics<'_>,
    path: &KeyPath,
    raw: &RawExecutor,
    base_dir: &Path,
    limits: Limits,
) -> Option<CommandSpec> {
    let Some(program) = &raw.program else {
        diag.error(&path.join(&["program"]), "required for kind = \"command\"");
        return None;
    };
    let program = resolve(base_dir, program);
    if let Err(e) = check_program(&program) {
        diag.error(&path.join(&["program"]), e);
    }
    let cwd = raw.cwd.as_deref().map(|c| resolve(base_dir, c));
    if let Some(dir) = &cwd
        && !dir.is_dir()
    {
        diag.error(
            &path.join(&["cwd"]),
            format!("{} is not an existing directory", dir.display()),
        );
    }
    let args = raw.args.clone().unwrap_or_default();
    for (i, arg) in args.iter().enumerate() {
        if arg.contains('\0') {
            diag.error(
                &path.join(&["args"]),
                format!("argument {i} contains a NUL byte"),
            );
        }
    }
    let env = raw.env.clone().unwrap_or_default();
    check_env(diag, &path.join(&["env"]), &env);
    let exit_codes = exit_codes(diag, &path.join(&["exit_codes"]), raw.exit_codes.as_ref());
    Some(CommandSpec {
        program,
        args,
        env,
        cwd,
        exit_codes,
        timeout: limits.timeout,
        kill_grace: limits.kill_grace,
    })
}

/// The program must exist (after symlinks), be a regular file and have an
/// execute bit set.
fn check_program(program: &Path) -> Result<(), String> {
    let shown = program.display();
    let meta = std::fs::metadata(program).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("program {shown} does not exist"),
        _ => format!("cannot inspect program {shown}: {e}"),
    })?;
    if !meta.is_file() {
        return Err(format!("program {shown} is not a regular file"));
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(format!(
            "program {shown} is not executable (mode {:04o}); run chmod +x on it",
            mode & 0o7777
        ));
    }
    Ok(())
}

fn check_env(diag: &mut Diagnostics<'_>, path: &KeyPath, env: &BTreeMap<String, String>) {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            diag.error(
                &path.join(&[name]),
                "environment variable names must be non-empty without `=` or NUL; values without NUL",
            );
        }
        if name.starts_with("QD_") {
            diag.error(
                &path.join(&[name]),
                "QD_* variables are set by qd for every attempt and cannot be overridden",
            );
        }
    }
}

/// Exit-code lists: an explicitly given list takes its codes away from the
/// defaulted ones (so `transient = [64]` moves 64 out of the default permanent
/// list); two explicit lists may not share a code.
fn exit_codes(diag: &mut Diagnostics<'_>, path: &KeyPath, raw: Option<&RawExitCodes>) -> ExitCodes {
    let lists = [
        ("transient", raw.and_then(|r| r.transient.clone()), vec![75]),
        (
            "permanent",
            raw.and_then(|r| r.permanent.clone()),
            vec![64, 65],
        ),
        ("throttled", raw.and_then(|r| r.throttled.clone()), vec![]),
    ];
    let explicit: Vec<(&str, &Vec<i32>)> = lists
        .iter()
        .filter_map(|(name, given, _)| given.as_ref().map(|g| (*name, g)))
        .collect();
    for (i, (name, codes)) in explicit.iter().enumerate() {
        for code in codes.iter() {
            if !(1..=255).contains(code) {
                diag.error(
                    &path.join(&[name]),
                    format!("exit code {code} is outside 1..=255 (0 always means success)"),
                );
            }
            if let Some((other, _)) = explicit[i + 1..].iter().find(|(_, c)| c.contains(code)) {
                diag.error(
                    &path.join(&[name]),
                    format!("exit code {code} is in both {name} and {other}"),
                );
            }
        }
    }
    let claimed: Vec<i32> = explicit
        .iter()
        .flat_map(|(_, c)| c.iter().copied())
        .collect();
    let [transient, permanent, throttled] = lists.map(|(_, given, default)| {
        given.unwrap_or_else(|| {
            default
                .into_iter()
                .filter(|c| !claimed.contains(c))
                .collect()
        })
    });
    ExitCodes {
        transient,
        permanent,
        throttled,
        other: raw.and_then(|r| r.other).unwrap_or(ErrorClass::Transient),
        throttle_delay: raw
            .and_then(|r| r.throttle_delay)
            .map_or(Duration::from_secs(1), |d| d.0),
    }
}

fn http(
    diag: &mut Diagnostics<'_>,
    path: &KeyPath,
    raw: &RawExecutor,
    limits: Limits,
) -> Option<HttpSpec> {
    let Some(url) = &raw.url else {
        diag.error(&path.join(&["url"]), "required for kind = \"http\"");
        return None;
    };
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
        Ok(parsed) => diag.error(
            &path.join(&["url"]),
            format!(
                "url {url:?} has scheme {:?}; only http and https are supported",
                parsed.scheme()
            ),
        ),
        Err(e) => diag.invalid(&path.join(&["url"]), format!("invalid url {url:?}: {e}")),
    }
    let headers = raw.headers.clone().unwrap_or_default();
    for (name, value) in &headers {
        let bad_name = reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err();
        let bad_value = reqwest::header::HeaderValue::from_str(value).is_err();
        if bad_name || bad_value {
            diag.error(
                &path.join(&["headers", name]),
                format!(
                    "invalid HTTP header {}",
                    if bad_name { "name" } else { "value" }
                ),
            );
        }
    }
    Some(HttpSpec {
        url: url.clone(),
        headers,
        timeout: limits.timeout,
        store_result: raw.store_result.unwrap_or(false),
        send_parents: raw.send_parents.unwrap_or(false),
    })
}
