//! `qctl enqueue QUEUE --ndjson FILE`: many jobs from a file (or stdin, `-`), one
//! JSON job object per line, sent through the admin socket's `enqueue_batch` in
//! batches of up to 1,000 jobs that fit one frame ([`qd_proto::MAX_FRAME`]).
//!
//! Each batch is all or nothing on the daemon and batches go in file order, so
//! after a failure exactly the job lines before one line (the "resume line") are
//! accepted: the error says how many and from which line to resume. Ids are
//! printed as each batch is accepted, one line per job line (with `--json`, one
//! `{"line", "id", "duplicate"}` object per line). A line may carry a `ref` that
//! later lines name in `after` ([`Refs`]).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;

use qd_proto::{ErrorBody, MAX_FRAME, Request, Response};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::client::{CliError, Client, over_frame};
use crate::commands::unexpected;

/// The most jobs one `enqueue_batch` carries (the daemon's limit).
const MAX_JOBS: usize = 1000;
/// Room in a frame for everything but the jobs (version, id, op, queue name).
const FRAME_ENVELOPE: usize = 1024;

/// Runs `qctl enqueue QUEUE --ndjson FILE`; `file` `-` reads stdin.
///
/// Errors: [`CliError::Usage`] for an unreadable file, input without a job line
/// (empty, or only blank lines: as for a single enqueue's empty stdin, that is
/// usually a forgotten pipe; nothing is sent) or a line that is not a JSON object
/// (naming the line), [`CliError::Daemon`] for a refused batch (naming the
/// line of the refused job when the daemon names one); both say how many jobs were
/// accepted before and where to resume.
pub fn enqueue(
    queue: String,
    file: &Path,
    json: bool,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<(), CliError> {
    let input: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(io::stdin().lock())
    } else {
        let f = File::open(file)
            .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", file.display())))?;
        Box::new(BufReader::new(f))
    };
    let mut sender = Sender {
        client: connect()?,
        budget: MAX_FRAME.saturating_sub(FRAME_ENVELOPE + queue.len()),
        queue,
        json,
        out: io::stdout().lock(),
        batch: Vec::new(),
        lines: Vec::new(),
        bytes: 0,
        accepted: 0,
        duplicates: 0,
        refs: Refs::default(),
    };
    for (n, line) in input.lines().enumerate() {
        let number = n + 1;
        let line = line.map_err(|e| sender.stop(number, format!("cannot read line: {e}")));
        let line = sender.flush_then(line)?;
        if line.trim().is_empty() {
            continue;
        }
        let job = parse_line(&line, sender.budget);
        let (job, _) = sender.flush_then(job.map_err(|e| sender.stop(number, e)))?;
        let resolved = sender.refs.resolve(&job, number, sender.budget);
        let (mut job, mut size) =
            sender.flush_then(resolved.map_err(|e| sender.stop(number, e)))?;
        if sender.batch.len() == MAX_JOBS || sender.bytes + size > sender.budget {
            sender.send()?;
            // The refs of the batch just sent are ids now.
            (job, size) = sender
                .refs
                .resolve(&job, number, sender.budget)
                .map_err(|e| sender.stop(number, e))?;
        }
        sender.refs.hold(&job, number, sender.batch.len());
        sender.batch.push(job);
        sender.lines.push(number);
        sender.bytes += size;
    }
    let from = if file == Path::new("-") {
        "stdin".to_string()
    } else {
        file.display().to_string()
    };
    if sender.accepted == 0 && sender.batch.is_empty() {
        return Err(CliError::Usage(format!(
            "{from} holds no job lines: nothing to enqueue (one JSON job object per line)"
        )));
    }
    sender.send()?;
    eprintln!(
        "qctl: enqueued {} from {from} ({} of them duplicates of earlier jobs)",
        jobs(sender.accepted),
        sender.duplicates
    );
    Ok(())
}

/// One line as a job object's JSON text, kept as written so that a payload's
/// numbers and key order reach the worker unchanged (sent as `job_texts`), and its
/// size in the frame (bytes as a JSON string, with its comma).
fn parse_line(line: &str, budget: usize) -> Result<(String, usize), String> {
    let job: Box<RawValue> = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    if !job.get().starts_with('{') {
        return Err(
            "not a job object: each line must be {\"payload\": ...} with the fields of the HTTP enqueue body"
                .into(),
        );
    }
    let job = job.get().to_owned();
    let size = Value::from(job.as_str()).to_string().len() + 1;
    if size > budget {
        return Err(over_frame("the job", size, budget));
    }
    Ok((job, size))
}

/// The batch being filled and what was accepted so far.
struct Sender<W: Write> {
    client: Client,
    queue: String,
    json: bool,
    out: W,
    /// Bytes of jobs one frame may carry.
    budget: usize,
    batch: Vec<String>,
    /// The file line of each job of `batch`.
    lines: Vec<usize>,
    bytes: usize,
    accepted: usize,
    duplicates: usize,
    refs: Refs,
}

/// The `ref`s of the lines so far. A line's `after` may name the `ref` of an
/// earlier line: within the batch being filled the daemon resolves it; a `ref`
/// of a batch already accepted is replaced by that job's id before the line is
/// sent, so a flow may span batches (each batch is still all or nothing).
#[derive(Default)]
struct Refs {
    /// Each `ref` given, with the line that gave it and its job's id once accepted.
    known: std::collections::HashMap<String, (usize, Option<String>)>,
    /// The `ref`s of the batch being filled, by index in the batch.
    pending: Vec<(usize, String)>,
}

impl Refs {
    /// `job` with the refs of accepted batches in its `after` replaced by their
    /// ids (unchanged, as written, when it names none), and its size in the frame.
    /// Errors: a `ref` given on an earlier line too, or a line grown past `budget`.
    fn resolve(&self, job: &str, number: usize, budget: usize) -> Result<(String, usize), String> {
        let mut fields: std::collections::BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(job).map_err(|e| format!("not a job object: {e}"))?;
        if let Some(name) = fields
            .get("ref")
            .and_then(|r| serde_json::from_str::<String>(r.get()).ok())
            && let Some((line, _)) = self.known.get(&name)
            && *line != number
        {
            return Err(format!("ref {name:?} was given on line {line} already"));
        }
        let after: Option<Vec<Value>> = fields
            .get("after")
            .and_then(|a| serde_json::from_str(a.get()).ok());
        let mut changed = false;
        let after: Option<Vec<Value>> = after.map(|entries| {
            entries
                .into_iter()
                .map(
                    |entry| match entry.as_str().and_then(|e| self.known.get(e)) {
                        Some((_, Some(id))) => {
                            changed = true;
                            Value::from(id.as_str())
                        }
                        _ => entry,
                    },
                )
                .collect()
        });
        if !changed {
            let size = Value::from(job).to_string().len() + 1;
            return Ok((job.to_owned(), size));
        }
        let after = serde_json::value::to_raw_value(&after).map_err(|e| e.to_string())?;
        fields.insert("after".into(), after);
        let job = serde_json::to_string(&fields).map_err(|e| e.to_string())?;
        let size = Value::from(job.as_str()).to_string().len() + 1;
        if size > budget {
            return Err(over_frame("the job", size, budget));
        }
        Ok((job, size))
    }

    /// Records the `ref` of `job` (line `number`), item `index` of the batch.
    fn hold(&mut self, job: &str, number: usize, index: usize) {
        let fields: Option<std::collections::BTreeMap<String, Box<RawValue>>> =
            serde_json::from_str(job).ok();
        let name = fields
            .as_ref()
            .and_then(|f| f.get("ref"))
            .and_then(|r| serde_json::from_str::<String>(r.get()).ok());
        if let Some(name) = name {
            self.known.insert(name.clone(), (number, None));
            self.pending.push((index, name));
        }
    }

    /// The batch was accepted with these ids, in order.
    fn accepted(&mut self, ids: &[String]) {
        for (index, name) in std::mem::take(&mut self.pending) {
            if let (Some(id), Some(entry)) = (ids.get(index), self.known.get_mut(&name)) {
                entry.1 = Some(id.clone());
            }
        }
    }
}

impl<W: Write> Sender<W> {
    /// On a bad line: sends the jobs before it first (so every line before it is
    /// accepted), then reports it.
    fn flush_then<T>(&mut self, item: Result<T, CliError>) -> Result<T, CliError> {
        match item {
            Ok(item) => Ok(item),
            Err(err) => {
                self.send()?;
                Err(err)
            }
        }
    }

    /// The error for bad line `number`, saying what was accepted (the pending batch
    /// is sent before it is reported, see [`Self::flush_then`]).
    fn stop(&self, number: usize, why: String) -> CliError {
        let accepted = self.accepted + self.batch.len();
        CliError::Usage(format!(
            "line {number}: {why}; {}",
            resume_note(accepted, number)
        ))
    }

    /// Sends the batch (if any) and prints its ids.
    fn send(&mut self) -> Result<(), CliError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let jobs = std::mem::take(&mut self.batch);
        let lines = std::mem::take(&mut self.lines);
        self.bytes = 0;
        let req = Request::EnqueueBatch {
            queue: self.queue.clone(),
            jobs: Vec::new(),
            job_texts: jobs,
        };
        let resp = match self.client.call(req) {
            Ok(resp) => resp,
            Err(CliError::Daemon(body)) => return Err(self.refused(body, &lines)),
            Err(other) => {
                let note = resume_note(self.accepted, lines[0]);
                return Err(CliError::Protocol(format!(
                    "{other}; the batch from line {} may or may not have been accepted; {note}",
                    lines[0]
                )));
            }
        };
        let Response::EnqueuedBatch { jobs } = &resp else {
            return Err(unexpected(&resp, "enqueue_batch"));
        };
        if jobs.len() != lines.len() {
            return Err(CliError::Protocol(format!(
                "qd answered {} ids for a batch of {} jobs",
                jobs.len(),
                lines.len()
            )));
        }
        for (job, line) in jobs.iter().zip(&lines) {
            let text = if self.json {
                serde_json::json!({ "line": line, "id": job.id, "duplicate": job.duplicate })
                    .to_string()
            } else {
                job.id.clone()
            };
            let written = writeln!(self.out, "{text}");
            if let Err(e) = written
                && e.kind() != io::ErrorKind::BrokenPipe
            {
                return Err(CliError::Protocol(format!("cannot write to stdout: {e}")));
            }
        }
        let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
        self.refs.accepted(&ids);
        self.accepted += jobs.len();
        self.duplicates += jobs.iter().filter(|j| j.duplicate).count();
        Ok(())
    }

    /// The daemon refused the batch of `lines`: name the refused job by its line,
    /// where the daemon names it by its index in the batch (`jobs[3]`), and say once
    /// that nothing of the batch was enqueued (the daemon says it for a batch over
    /// `max_depth`; qctl adds from which line).
    fn refused(&self, mut body: ErrorBody, lines: &[usize]) -> CliError {
        let message = body
            .message
            .strip_suffix("; nothing of the batch was enqueued")
            .unwrap_or(&body.message);
        let message = match body
            .index
            .and_then(|i| Some((format!("jobs[{i}]"), lines.get(i)?)))
        {
            Some((index, line)) if message.contains(&index) => {
                message.replace(&index, &format!("line {line}"))
            }
            Some((_, line)) => format!("line {line}: {message}"),
            None => message.to_string(),
        };
        body.message = format!(
            "{message}; nothing of the batch from line {} was enqueued; {}",
            lines[0],
            resume_note(self.accepted, lines[0])
        );
        CliError::Daemon(body)
    }
}

/// What a failed run leaves: `accepted` jobs, every job line before `resume`.
fn resume_note(accepted: usize, resume: usize) -> String {
    let were = if accepted == 1 { "was" } else { "were" };
    format!(
        "{} from the lines before line {resume} {were} accepted; resume from line {resume} (e.g. tail -n +{resume} FILE | qctl enqueue QUEUE --ndjson -)",
        jobs(accepted)
    )
}

/// `n` jobs, in words: `1 job`, `0 jobs`, `2 jobs`.
fn jobs(n: usize) -> String {
    if n == 1 {
        "1 job".into()
    } else {
        format!("{n} jobs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_must_be_a_job_object_that_fits_a_frame() {
        let (job, size) = parse_line(r#"{"payload":"hi"}"#, 100).expect("a job");
        assert_eq!(job, r#"{"payload":"hi"}"#);
        assert_eq!(
            size,
            r#""{\"payload\":\"hi\"}""#.len() + 1,
            "as a JSON string"
        );
        let written = r#" {"payload": {"n": 18446744073709551617, "b": 1, "a": 2}} "#;
        let (job, _) = parse_line(written, 200).expect("a job");
        assert_eq!(
            job,
            written.trim(),
            "sent as written: numbers and key order kept"
        );
        let bad = parse_line("{oops", 100).expect_err("not JSON");
        assert!(bad.starts_with("not JSON"), "{bad}");
        let bad = parse_line("[1]", 100).expect_err("an array");
        assert!(bad.contains("not a job object"), "{bad}");
        let bad = parse_line(r#"{"payload":"0123456789"}"#, 10).expect_err("too big");
        assert!(bad.contains("at most 10"), "{bad}");
    }

    #[test]
    fn the_resume_note_names_the_count_and_the_line() {
        let note = resume_note(1000, 1003);
        assert!(
            note.starts_with("1000 jobs from the lines before line 1003"),
            "{note}"
        );
        assert!(note.contains("tail -n +1003"), "{note}");
        let note = resume_note(1, 3);
        assert!(
            note.starts_with("1 job from the lines before line 3 was accepted"),
            "{note}"
        );
    }
}
