//! Compiling `[schedules.NAME]`: the spec (`cron` in `timezone`, or `every`), the
//! job each tick enqueues (queue, payload, tenant, retry budget) and the catch-up
//! and overlap policies. Expressions and zones are checked by `croner` and
//! `chrono-tz` ([`crate::schedule`]); every problem is reported at its key.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;

use super::super::ScheduleConfig;
use super::super::diag::{Diagnostics, KeyPath};
use super::super::raw::{Named, RawCatchUp, RawDoc, RawOverlap, RawSchedule};
use super::check_name;
use crate::config::MAX_ATTEMPTS_LIMIT;
use crate::config::QueueConfig;
use crate::schedule::{self, CatchUp, Overlap, Spec, Timing};

/// The shortest `every`: a tick is a durable write.
const MIN_EVERY: Duration = Duration::from_secs(1);

/// Compiles every schedule; `queues` are the compiled queues (a schedule naming a
/// queue whose table is broken is not reported again).
pub(crate) fn compile_schedules(
    diag: &mut Diagnostics<'_>,
    doc: &RawDoc,
    queues: &BTreeMap<String, QueueConfig>,
    max_payload: usize,
) -> BTreeMap<String, ScheduleConfig> {
    let declared: Vec<&str> = doc
        .queues
        .iter()
        .flatten()
        .map(|q| q.name.as_str())
        .collect();
    let mut compiled = BTreeMap::new();
    for Named { name, raw } in &doc.schedules {
        let path = KeyPath::of(&["schedules", name]);
        check_name(diag, &path, "schedule", name);
        let Some(raw) = raw else { continue };
        let one = One {
            path: &path,
            raw,
            declared: &declared,
            queues,
            max_payload,
        };
        if let Some(schedule) = one.compile(diag, name) {
            compiled.insert(name.clone(), schedule);
        }
    }
    compiled
}

struct One<'a> {
    path: &'a KeyPath,
    raw: &'a RawSchedule,
    declared: &'a [&'a str],
    queues: &'a BTreeMap<String, QueueConfig>,
    max_payload: usize,
}

impl One<'_> {
    fn at(&self, key: &str) -> KeyPath {
        self.path.join(&[key])
    }

    /// The schedule, or `None` after recording why it cannot be built.
    fn compile(&self, diag: &mut Diagnostics<'_>, name: &str) -> Option<ScheduleConfig> {
        let raw = self.raw;
        let queue = self.queue(diag);
        let timing = self.timing(diag);
        let payload = self.payload(diag);
        if let Some(tenant) = &raw.tenant {
            check_name(diag, &self.at("tenant"), "tenant", tenant);
        }
        if let Some(n) = raw.max_attempts
            && !(1..=MAX_ATTEMPTS_LIMIT).contains(&n)
        {
            diag.error(
                &self.at("max_attempts"),
                format!("must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {n}"),
            );
        }
        let max = raw.max_catch_up.unwrap_or(schedule::DEFAULT_MAX_CATCH_UP);
        if max < 1 {
            diag.error(&self.at("max_catch_up"), "must be at least 1");
        } else if raw.max_catch_up.is_some() && raw.catch_up != Some(RawCatchUp::All) {
            diag.error(
                &self.at("max_catch_up"),
                "only applies with catch_up = \"all\"; remove it or set catch_up",
            );
        }
        let catch_up = match raw.catch_up {
            None | Some(RawCatchUp::Latest) => CatchUp::Latest,
            Some(RawCatchUp::None) => CatchUp::None,
            Some(RawCatchUp::All) => CatchUp::All { max: max.max(1) },
        };
        let overlap = match raw.overlap {
            None | Some(RawOverlap::Allow) => Overlap::Allow,
            Some(RawOverlap::Skip) => Overlap::Skip,
        };
        Some(ScheduleConfig {
            name: name.to_owned(),
            queue: queue?,
            timing: timing?,
            payload: payload?,
            tenant: raw.tenant.clone(),
            max_attempts: raw.max_attempts,
            catch_up,
            overlap,
        })
    }

    fn queue(&self, diag: &mut Diagnostics<'_>) -> Option<String> {
        let Some(queue) = &self.raw.queue else {
            diag.error(self.path, "missing key `queue`: the queue its jobs go to");
            return None;
        };
        if !self.declared.contains(&queue.as_str()) {
            let known: Vec<&str> = self.queues.keys().map(String::as_str).collect();
            diag.error(
                &self.at("queue"),
                format!("unknown queue {queue:?} (known: {})", known.join(", ")),
            );
            return None;
        }
        Some(queue.clone())
    }

    fn timing(&self, diag: &mut Diagnostics<'_>) -> Option<Timing> {
        let raw = self.raw;
        let tz = match &raw.timezone {
            None => Some(chrono_tz::UTC),
            Some(zone) => schedule::parse_timezone(zone)
                .map_err(|e| diag.error(&self.at("timezone"), e))
                .ok(),
        };
        let spec = match (&raw.cron, raw.every) {
            (Some(_), Some(_)) => {
                diag.error(&self.at("every"), "set either cron or every, not both");
                None
            }
            (None, None) => {
                let broken = diag.is_broken(&self.at("every"));
                if !broken {
                    diag.error(
                        self.path,
                        "missing key `cron` or `every`: when the schedule's ticks come",
                    );
                }
                None
            }
            (Some(expr), None) => schedule::parse_cron(expr)
                .map(|cron| Spec::Cron(Box::new(cron)))
                .map_err(|e| diag.error(&self.at("cron"), e))
                .ok(),
            (None, Some(every)) => {
                if every.0 < MIN_EVERY {
                    diag.error(&self.at("every"), "must be at least 1s");
                    None
                } else {
                    if raw.timezone.is_some() {
                        diag.error(
                            &self.at("timezone"),
                            "only applies to cron; `every` ticks at multiples of its interval in UTC",
                        );
                    }
                    Some(Spec::Every(every.0))
                }
            }
        };
        let jitter = raw.jitter.map_or(Duration::ZERO, |j| j.0);
        if let Some(Spec::Every(every)) = &spec
            && jitter >= *every
        {
            diag.error(
                &self.at("jitter"),
                format!(
                    "must be shorter than every ({}), or ticks would fire out of order",
                    humantime::format_duration(*every)
                ),
            );
        }
        Some(Timing {
            spec: spec?,
            tz: tz?,
            jitter,
        })
    }

    fn payload(&self, diag: &mut Diagnostics<'_>) -> Option<Vec<u8>> {
        let raw = self.raw;
        let bytes = match (&raw.payload, &raw.payload_b64) {
            (Some(_), Some(_)) => {
                diag.error(
                    &self.at("payload_b64"),
                    "set either payload or payload_b64, not both",
                );
                return None;
            }
            (Some(text), None) => text.clone().into_bytes(),
            (None, Some(b64)) => match base64::engine::general_purpose::STANDARD.decode(b64) {
                Ok(bytes) => bytes,
                Err(e) => {
                    diag.error(&self.at("payload_b64"), format!("not valid base64: {e}"));
                    return None;
                }
            },
            (None, None) => Vec::new(),
        };
        if bytes.len() > self.max_payload {
            let key = if raw.payload.is_some() {
                "payload"
            } else {
                "payload_b64"
            };
            diag.error(
                &self.at(key),
                format!(
                    "is {} bytes; daemon.max_payload is {} bytes",
                    bytes.len(),
                    self.max_payload
                ),
            );
            return None;
        }
        Some(bytes)
    }
}
