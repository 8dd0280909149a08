//! Commands whose output is data rather than a report: `jobs payload` (the exact
//! payload bytes) and `dlq export` (one JSON line per dead job, fetched and written
//! a page at a time so memory stays bounded). Both write to stdout or `--output FILE`;
//! a reader that goes away (`| head`) ends the output quietly. An export to a regular
//! file is written beside it and renamed over it once complete: a refused or failed
//! export leaves FILE as it was.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use qd_proto::{Payload, Request, Response};

use crate::cli::DlqFilter;
use crate::client::{CliError, Client};
use crate::commands::unexpected;

/// Dead jobs per export request (each carries its whole payload, up to `max_payload`).
const EXPORT_PAGE: u32 = 50;

/// `qctl jobs payload ID [--output FILE]`: the payload bytes, unchanged; with `json`
/// and no file, the protocol answer (base64) instead.
pub fn payload(
    id: String,
    output: Option<PathBuf>,
    json: bool,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<(), CliError> {
    let resp = connect()?.call(Request::JobsPayload { id })?;
    let Response::Payload(p) = &resp else {
        return Err(unexpected(&resp, "jobs_payload"));
    };
    let b64 = p.payload_b64.clone();
    write_bytes(&resp, b64, "payload", output.as_deref(), json)
}

/// Writes bytes qd sent in base64 to `output` (created 0600) or stdout; with
/// `json` and no file, the protocol answer `resp` instead.
fn write_bytes(
    resp: &Response,
    b64: String,
    what: &str,
    output: Option<&Path>,
    json: bool,
) -> Result<(), CliError> {
    let bytes = if json && output.is_none() {
        let mut text = serde_json::to_vec_pretty(resp)
            .map_err(|e| CliError::Protocol(format!("cannot print JSON: {e}")))?;
        text.push(b'\n');
        text
    } else {
        Payload::Base64(b64)
            .into_bytes()
            .map_err(|e| CliError::Protocol(format!("qd sent a bad {what}: {e}")))?
    };
    let mut out = sink(output)?;
    finish(out.write_all(&bytes).and_then(|()| out.flush()), output)
}

/// `qctl jobs result ID [--output FILE]`: the result bytes, unchanged; with `json`
/// and no file, the protocol answer (base64) instead. FILE is created with mode
/// 0600 (a result may hold what the payload did not: a token, an address). A job
/// without a result is refused by qd (`not_found`, naming its state) before
/// anything is written.
pub fn result(
    id: String,
    output: Option<PathBuf>,
    json: bool,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<(), CliError> {
    let resp = connect()?.call(Request::JobsResult { id })?;
    let Response::JobResult(r) = &resp else {
        return Err(unexpected(&resp, "jobs_result"));
    };
    let b64 = r.result_b64.clone();
    write_bytes(&resp, b64, "result", output.as_deref(), json)
}

/// `qctl dlq export [filters] [--output FILE]`: every matching dead job as one JSON
/// line (`ExportedJob`), most recently dead first. Reports the count on stderr when
/// writing a file. A regular FILE is replaced only by a complete export: the lines
/// go to a temporary file beside it (`.NAME.qctl-partial-PID`, beside the target of
/// a symlink), given FILE's mode and owner, renamed over FILE at the end and
/// removed on any error. Anything else FILE names (a FIFO, a device such as
/// `/dev/stdout`) is written to directly: renaming over it would replace it.
pub fn dlq_export(
    filter: &DlqFilter,
    output: Option<PathBuf>,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<(), CliError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut client = connect()?;
    let Some(shown) = output else {
        return export(&mut client, filter, sink(None)?, None).map(|_| ());
    };
    // What FILE names: a symlink's target is replaced, not the link.
    let path = std::fs::canonicalize(&shown).unwrap_or_else(|_| shown.clone());
    let existing = std::fs::metadata(&path).ok();
    if existing.as_ref().is_some_and(|m| !m.is_file()) {
        let count = export(&mut client, filter, sink(Some(&shown))?, Some(&shown))?;
        eprintln!("qctl: exported {count} dead jobs to {}", shown.display());
        return Ok(());
    }
    let name = path
        .file_name()
        .map_or_else(|| "export".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.qctl-partial-{}", std::process::id()));
    // Never through a planted symlink; private until it has FILE's mode.
    let cannot_create =
        |e: io::Error| CliError::Usage(format!("cannot create {}: {e}", shown.display()));
    let mut options = File::options();
    options.write(true).create_new(true);
    // A new file holds payloads: readable by its owner only, as backups are.
    options.mode(0o600);
    let file = options.open(&tmp).map_err(cannot_create)?;
    if let Some(meta) = &existing {
        // Best effort for the owner (only root may give a file away).
        let _ = std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()));
        if let Err(e) = file.set_permissions(meta.permissions()) {
            let _ = std::fs::remove_file(&tmp);
            return Err(cannot_create(e));
        }
    }
    let written = export(
        &mut client,
        filter,
        Box::new(BufWriter::new(file)),
        Some(&shown),
    )
    .and_then(|count| {
        std::fs::rename(&tmp, &path)
            .map(|()| count)
            .map_err(|e| CliError::Protocol(format!("cannot write to {}: {e}", shown.display())))
    });
    match written {
        Ok(count) => {
            eprintln!("qctl: exported {count} dead jobs to {}", shown.display());
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Writes every page of the export to `out` and returns how many jobs it wrote;
/// `output` names the file for error messages (`None`: stdout).
fn export(
    client: &mut Client,
    filter: &DlqFilter,
    mut out: Box<dyn Write>,
    output: Option<&Path>,
) -> Result<usize, CliError> {
    let mut after = None;
    let mut count = 0usize;
    loop {
        let resp = client.call(Request::DlqExport {
            selection: filter.selection(),
            limit: Some(EXPORT_PAGE),
            after: after.take(),
        })?;
        let Response::Export { jobs, next_after } = resp else {
            return Err(unexpected(&resp, "dlq_export"));
        };
        for job in &jobs {
            let written = serde_json::to_writer(&mut out, job)
                .map_err(io::Error::from)
                .and_then(|()| out.write_all(b"\n"));
            if let Err(e) = written {
                return finish(Err(e), output).map(|()| count);
            }
        }
        count += jobs.len();
        match next_after {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    finish(out.flush(), output)?;
    Ok(count)
}

/// Where the data goes: the file (truncated, or created 0600: it holds payloads)
/// or stdout.
fn sink(output: Option<&Path>) -> Result<Box<dyn Write>, CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    Ok(match output {
        Some(path) => {
            let file = File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", path.display())))?;
            Box::new(BufWriter::new(file))
        }
        None => Box::new(BufWriter::new(io::stdout().lock())),
    })
}

/// Maps a write result: a closed pipe on stdout is not an error.
fn finish(written: io::Result<()>, output: Option<&Path>) -> Result<(), CliError> {
    match written {
        Ok(()) => Ok(()),
        Err(e) if output.is_none() && e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => {
            let to = output.map_or("stdout".into(), |p| p.display().to_string());
            Err(CliError::Protocol(format!("cannot write to {to}: {e}")))
        }
    }
}
