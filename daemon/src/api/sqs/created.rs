//! Queues created through SQS's `CreateQueue`: their SQS attributes and tags, the
//! checks SQS applies to the attributes a caller sets, and how such a queue becomes
//! a qd queue.
//!
//! A created queue is a row of the store's `sqs_queues` table (its attributes and
//! tags as JSON), so it survives restarts and, on PostgreSQL, is seen by every
//! node. [`merge`] adds the rows to the config in force as external queues beside
//! the file's (at start, on every reload, and via `SupervisorMsg::SqsQueuesChanged`
//! when the SQS API of this node or, on PostgreSQL, of another changed a row;
//! [`in_force`] tells a heartbeat whether one was missed); from then on a created
//! queue is an ordinary qd queue: scheduled, counted in metrics, listed by `qctl
//! queues`. A file queue of the same name wins over a row.
//!
//! The mapping onto qd's settings: `VisibilityTimeout` is the lease (0 is kept as
//! the SQS value and applied per receive as an uncharged return; the lease is then
//! 1 s); `RedrivePolicy.maxReceiveCount` is `max_attempts` (without a redrive
//! policy a message is never dead-lettered, as in SQS); the backoff after a
//! visibility timeout is 0 (the message is visible again at once, as in SQS).
//! `DelaySeconds`, `ReceiveMessageWaitTimeSeconds` and `MaximumMessageSize` are the
//! defaults and limit `send.rs` and `receive.rs` apply. A dead-letter queue's
//! `RedriveAllowPolicy` decides which queues may name it in their
//! `RedrivePolicy` ([`check_redrive_allowed`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};
use tracing::warn;

use super::error::{ErrorKind, SqsError};
use crate::backoff::{Backoff, Jitter};
use crate::config::{Config, QueueConfig, WorkersConfig};
use crate::executor::ExecutorSpec;
use crate::store::SqsQueueRecord;

/// An integer attribute's SQS default and range: `(default, min, max)`.
type IntRange = (&'static str, i64, i64);

/// The attributes a caller may set, their SQS defaults, and their integer ranges
/// (`None` for the JSON-valued policies, which have no default).
const SETTABLE: &[(&str, Option<IntRange>)] = &[
    ("DelaySeconds", Some(("0", 0, 900))),
    ("MaximumMessageSize", Some(("1048576", 1024, 1_048_576))),
    ("MessageRetentionPeriod", Some(("345600", 60, 1_209_600))),
    ("ReceiveMessageWaitTimeSeconds", Some(("0", 0, 20))),
    ("VisibilityTimeout", Some(("30", 0, 43_200))),
    ("RedrivePolicy", None),
    ("RedriveAllowPolicy", None),
    ("Policy", None),
];

/// SQS's largest `maxReceiveCount`.
const MAX_RECEIVE_COUNT: i64 = 1000;

/// The most tags a queue may have.
pub const MAX_TAGS: usize = 50;

pub use crate::config::CreatedQueue;

/// A queue's redrive policy: after `max_receive_count` receives a message is dead,
/// and SQS clients see it through the queue `dead_letter_target_arn` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedrivePolicy {
    /// The ARN of the dead-letter queue.
    pub dead_letter_target_arn: String,
    /// Receives before a message is dead-lettered (1 to 1,000).
    pub max_receive_count: u32,
}

impl CreatedQueue {
    /// A new queue with SQS's defaults overlaid by `given` (already checked).
    pub fn new(given: BTreeMap<String, String>, tags: BTreeMap<String, String>) -> Self {
        let now = crate::clock::wall_ms();
        let mut attributes: BTreeMap<String, String> = SETTABLE
            .iter()
            .filter_map(|(name, range)| range.map(|(d, _, _)| (name.to_string(), d.to_string())))
            .collect();
        for (k, v) in given {
            if !v.is_empty() {
                attributes.insert(k, v);
            }
        }
        CreatedQueue {
            attributes,
            tags,
            created_at: now,
            modified_at: now,
        }
    }

    /// Sets `given` (already checked); an empty policy value removes the policy.
    pub fn set(&mut self, given: BTreeMap<String, String>) {
        for (k, v) in given {
            if v.is_empty() {
                self.attributes.remove(&k);
            } else {
                self.attributes.insert(k, v);
            }
        }
        self.modified_at = crate::clock::wall_ms().max(self.modified_at);
    }

    /// An integer attribute (one with a default, so always present).
    pub fn int(&self, name: &str) -> i64 {
        let default = SETTABLE
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, r)| r.map(|(d, _, _)| d))
            .unwrap_or("0");
        self.attributes
            .get(name)
            .map_or(default, String::as_str)
            .parse()
            .unwrap_or(0)
    }

    /// The queue's redrive policy, if it has one.
    pub fn redrive_policy(&self) -> Option<RedrivePolicy> {
        let text = self.attributes.get("RedrivePolicy")?;
        let v: Value = serde_json::from_str(text).ok()?;
        Some(RedrivePolicy {
            dead_letter_target_arn: v.get("deadLetterTargetArn")?.as_str()?.to_string(),
            max_receive_count: u32::try_from(v.get("maxReceiveCount")?.as_i64()?).ok()?,
        })
    }

    /// The store's row of this queue.
    pub fn record(&self, name: &str) -> SqsQueueRecord {
        SqsQueueRecord {
            name: name.to_string(),
            attributes: serde_json::to_string(&self.attributes).unwrap_or_else(|_| "{}".into()),
            tags: serde_json::to_string(&self.tags).unwrap_or_else(|_| "{}".into()),
            created_at: self.created_at,
            modified_at: self.modified_at,
        }
    }

    /// A store row read back; `None` if its JSON is not an object of strings.
    pub fn from_record(record: &SqsQueueRecord) -> Option<Self> {
        Some(CreatedQueue {
            attributes: serde_json::from_str(&record.attributes).ok()?,
            tags: serde_json::from_str(&record.tags).ok()?,
            created_at: record.created_at,
            modified_at: record.modified_at,
        })
    }

    /// The qd queue this SQS queue is: external workers (SQS clients), the
    /// visibility timeout as the lease, `maxReceiveCount` as the attempt budget
    /// (unlimited without a redrive policy), no backoff, qd's built-in defaults
    /// for the rest.
    pub fn queue_config(&self, name: &str) -> QueueConfig {
        let visibility = Duration::from_secs(self.int("VisibilityTimeout").unsigned_abs());
        let lease = visibility.max(Duration::from_secs(1));
        QueueConfig {
            name: name.to_string(),
            executor: ExecutorSpec::External,
            lease,
            heartbeat: (lease / 2).min(Duration::from_secs(10)),
            timeout: Duration::from_secs(300),
            max_attempts: self
                .redrive_policy()
                .map_or(u32::MAX, |p| p.max_receive_count),
            backoff: Backoff {
                base: Duration::ZERO,
                max: Duration::ZERO,
                jitter: Jitter::None,
            },
            max_depth: 100_000,
            retention: Duration::from_secs(86_400),
            workers: WorkersConfig {
                min: 0,
                max: 0,
                target_age: Duration::from_secs(5),
                idle_cooldown: Duration::from_secs(30),
            },
            rate_limiter: None,
            fairness: Default::default(),
            tenant_caps: BTreeMap::new(),
            max_result: crate::results::DEFAULT_MAX_RESULT,
        }
    }
}

/// Puts the store's SQS-created queues in `config`, in place of those it had: each
/// becomes a queue of [`Config::queues`] and an entry of `config.sqs.created`. A
/// name the file defines stays the file's (logged); an unreadable row is skipped
/// (logged).
pub fn merge(config: &mut Config, records: &[SqsQueueRecord]) {
    let before = std::mem::take(&mut config.sqs.created);
    for name in before.keys() {
        config.queues.remove(name);
    }
    for record in records {
        let name = &record.name;
        if config.queues.contains_key(name) {
            warn!(queue = %name, "An SQS-created queue has the name of a queue in the config file; the file's queue is in force.");
            continue;
        }
        let Some(created) = CreatedQueue::from_record(record) else {
            warn!(queue = %name, "An SQS-created queue's stored attributes are unreadable; it is not served.");
            continue;
        };
        config
            .queues
            .insert(name.clone(), created.queue_config(name));
        config.sqs.created.insert(name.clone(), created);
    }
}

/// Whether the SQS-created queues in force in `config` are those the store's
/// `records` hold, as [`merge`] would put them in force (the Cluster heartbeat
/// asks, to apply changes whose announcement it missed).
pub fn in_force(config: &Config, records: &[SqsQueueRecord]) -> bool {
    let stored: BTreeMap<&String, CreatedQueue> = records
        .iter()
        .filter(|r| {
            !config.queues.contains_key(&r.name) || config.sqs.created.contains_key(&r.name)
        })
        .filter_map(|r| Some((&r.name, CreatedQueue::from_record(r)?)))
        .collect();
    stored.len() == config.sqs.created.len()
        && stored
            .iter()
            .zip(&config.sqs.created)
            .all(|((name, q), (have_name, have))| *name == have_name && q == have)
}

/// Checks a queue name as SQS does (1 to 80 of `A-Za-z0-9_-`), and against qd's
/// own limit of 64 characters. A `.fifo` name is refused: qd has no FIFO queues.
pub fn check_name(name: &str) -> Result<(), SqsError> {
    if name.ends_with(".fifo") {
        return Err(fifo_refused());
    }
    let valid = !name.is_empty()
        && name.len() <= 80
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(SqsError::invalid(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ));
    }
    if name.len() > 64 {
        return Err(SqsError::invalid(format!(
            "Queue name {name:?} is {} characters; qd's queue names are at most 64.",
            name.len()
        )));
    }
    Ok(())
}

fn fifo_refused() -> SqsError {
    SqsError::new(
        ErrorKind::UnsupportedOperation,
        "qd has no FIFO queues; create a standard queue (MessageGroupId still orders fairness between groups)",
    )
}

/// Checks attributes a caller sets (CreateQueue, SetQueueAttributes) and answers
/// them in the form stored: integers as written, policies as compact JSON, an
/// empty policy (which removes it) as "". `queue_exists` says whether an ARN names
/// a queue of this qd (a dead-letter target must exist).
///
/// Errors: `InvalidAttributeName` for a name SQS does not define for a standard
/// queue (FIFO-only ones included) or one only SQS computes (`QueueArn`, ...); `InvalidAttributeValue` for a value out of its
/// range or a malformed policy; `UnsupportedOperation` for a FIFO queue.
pub fn check_attributes(
    given: &[(String, String)],
    queue_exists: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, String>, SqsError> {
    let mut out = BTreeMap::new();
    for (name, value) in given {
        let checked = match SETTABLE.iter().find(|(n, _)| n == name) {
            Some((_, Some((_, min, max)))) => {
                let n = value
                    .trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|n| (*min..=*max).contains(n));
                match n {
                    Some(n) => n.to_string(),
                    None => {
                        return Err(bad_value(format!(
                            "Invalid value for the parameter {name}: {value:?} must be an integer from {min} to {max}."
                        )));
                    }
                }
            }
            Some((_, None)) if value.is_empty() => String::new(),
            Some((_, None)) => check_policy(name, value, &queue_exists)?,
            None => match name.as_str() {
                "FifoQueue" if value == "false" => continue,
                "FifoQueue" => return Err(fifo_refused()),
                "SqsManagedSseEnabled" if value == "false" => continue,
                "SqsManagedSseEnabled" | "KmsMasterKeyId" | "KmsDataKeyReusePeriodSeconds" => {
                    return Err(bad_value(format!(
                        "Invalid value for the parameter {name}: qd does not encrypt queues with SQS-managed or KMS keys (encrypt the store's disk instead)."
                    )));
                }
                _ => {
                    return Err(SqsError::new(
                        ErrorKind::InvalidAttributeName,
                        format!("Unknown Attribute {name}."),
                    ));
                }
            },
        };
        out.insert(name.clone(), checked);
    }
    Ok(out)
}

/// `InvalidAttributeValue`, as SQS answers a queue attribute out of its range.
fn bad_value(message: String) -> SqsError {
    SqsError::new(ErrorKind::InvalidAttributeValue, message)
}

/// One JSON-valued policy attribute, checked and written compactly.
fn check_policy(
    name: &str,
    value: &str,
    queue_exists: &impl Fn(&str) -> bool,
) -> Result<String, SqsError> {
    let bad = |reason: &str| {
        bad_value(format!(
            "Value {value} for parameter {name} is invalid. Reason: {reason}"
        ))
    };
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(value) else {
        return Err(bad("Invalid JSON object."));
    };
    match name {
        "RedrivePolicy" => {
            let arn = map
                .get("deadLetterTargetArn")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("Redrive policy does not contain deadLetterTargetArn."))?;
            let count = match map.get("maxReceiveCount") {
                Some(Value::Number(n)) => n.as_i64(),
                Some(Value::String(s)) => s.trim().parse::<i64>().ok(),
                _ => return Err(bad("Redrive policy does not contain maxReceiveCount.")),
            }
            .filter(|n| (1..=MAX_RECEIVE_COUNT).contains(n))
            .ok_or_else(|| {
                bad(&format!(
                    "Invalid value for maxReceiveCount: must be an integer from 1 to {MAX_RECEIVE_COUNT}."
                ))
            })?;
            if let Some(other) = map
                .keys()
                .find(|k| *k != "deadLetterTargetArn" && *k != "maxReceiveCount")
            {
                return Err(bad(&format!(
                    "Unknown field {other} in the redrive policy."
                )));
            }
            if !queue_exists(arn) {
                return Err(bad("Dead letter target does not exist."));
            }
            let mut out = Map::new();
            out.insert("deadLetterTargetArn".into(), Value::String(arn.into()));
            out.insert("maxReceiveCount".into(), Value::from(count));
            Ok(Value::Object(out).to_string())
        }
        "RedriveAllowPolicy" => {
            let permission = map
                .get("redrivePermission")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("Redrive allow policy does not contain redrivePermission."))?;
            let sources = map.get("sourceQueueArns");
            match (permission, sources) {
                ("allowAll" | "denyAll", None) => {}
                ("byQueue", Some(Value::Array(arns)))
                    if (1..=10).contains(&arns.len()) && arns.iter().all(Value::is_string) => {}
                ("byQueue", _) => {
                    return Err(bad(
                        "byQueue needs sourceQueueArns, a list of 1 to 10 queue ARNs.",
                    ));
                }
                ("allowAll" | "denyAll", Some(_)) => {
                    return Err(bad("sourceQueueArns is only allowed with byQueue."));
                }
                _ => {
                    return Err(bad(
                        "redrivePermission must be allowAll, denyAll or byQueue.",
                    ));
                }
            }
            Ok(Value::Object(map).to_string())
        }
        _ => Ok(Value::Object(map).to_string()),
    }
}

/// Checks that the dead-letter queue a `RedrivePolicy` among `given` names lets
/// `source_arn` use it, as its `RedriveAllowPolicy` says: `allowAll` (or no
/// policy, a queue of the config file included) lets every queue, `denyAll` none,
/// `byQueue` those in its `sourceQueueArns`. `dead_letter_queue` finds an ARN's
/// SQS-created queue. Run after [`check_attributes`] (the policy is then valid
/// and its target exists).
///
/// Errors: `InvalidParameterValue` naming the source, the dead-letter queue and
/// why, as SQS refuses such a policy.
pub fn check_redrive_allowed<'c>(
    given: &BTreeMap<String, String>,
    source_arn: &str,
    dead_letter_queue: impl Fn(&str) -> Option<&'c CreatedQueue>,
) -> Result<(), SqsError> {
    let Some(text) = given.get("RedrivePolicy").filter(|t| !t.is_empty()) else {
        return Ok(());
    };
    let Some(target) = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| Some(v.get("deadLetterTargetArn")?.as_str()?.to_string()))
    else {
        return Ok(());
    };
    let Some(allow) = dead_letter_queue(&target)
        .and_then(|q| q.attributes.get("RedriveAllowPolicy"))
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
    else {
        return Ok(());
    };
    let listed = |arns: &Value| {
        arns.as_array()
            .is_some_and(|a| a.iter().any(|arn| arn.as_str() == Some(source_arn)))
    };
    let why = match allow.get("redrivePermission").and_then(Value::as_str) {
        Some("denyAll") => "its RedriveAllowPolicy is denyAll",
        Some("byQueue") if !allow.get("sourceQueueArns").is_some_and(listed) => {
            "its RedriveAllowPolicy (byQueue) does not list this queue in sourceQueueArns"
        }
        _ => return Ok(()),
    };
    Err(SqsError::invalid(format!(
        "Value {text} for parameter RedrivePolicy is invalid. Reason: Queue {source_arn} is not allowed to use {target} as its dead-letter queue: {why}."
    )))
}

/// Checks tags as SQS does: keys of 1 to 128 characters, values of at most 256, at
/// most [`MAX_TAGS`] in `tags`.
pub fn check_tags(tags: &[(String, String)]) -> Result<BTreeMap<String, String>, SqsError> {
    let mut out = BTreeMap::new();
    for (k, v) in tags {
        if k.is_empty() || k.chars().count() > 128 {
            return Err(SqsError::invalid(format!(
                "Tag key {k:?} must be 1 to 128 characters."
            )));
        }
        if v.chars().count() > 256 {
            return Err(SqsError::invalid(format!(
                "The value of tag {k:?} must be at most 256 characters."
            )));
        }
        out.insert(k.clone(), v.clone());
    }
    if out.len() > MAX_TAGS {
        return Err(SqsError::invalid(format!(
            "Too many tags: a queue has at most {MAX_TAGS}."
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn attributes_are_checked_against_sqs_ranges_and_names() {
        let exists = |arn: &str| arn.ends_with(":dlq");
        let ok = check_attributes(
            &pairs(&[
                ("VisibilityTimeout", "45"),
                (
                    "RedrivePolicy",
                    r#"{"maxReceiveCount":"3","deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:dlq"}"#,
                ),
                ("FifoQueue", "false"),
            ]),
            exists,
        )
        .expect("valid");
        assert_eq!(ok["VisibilityTimeout"], "45");
        assert_eq!(
            ok["RedrivePolicy"],
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:dlq","maxReceiveCount":3}"#
        );
        assert!(!ok.contains_key("FifoQueue"));
        let kind = |p: &[(&str, &str)]| check_attributes(&pairs(p), exists).expect_err("bad").kind;
        assert_eq!(
            kind(&[("VisibilityTimeout", "43201")]),
            ErrorKind::InvalidAttributeValue
        );
        assert_eq!(
            kind(&[("DelaySeconds", "x")]),
            ErrorKind::InvalidAttributeValue
        );
        assert_eq!(kind(&[("Colour", "red")]), ErrorKind::InvalidAttributeName);
        assert_eq!(kind(&[("QueueArn", "x")]), ErrorKind::InvalidAttributeName);
        assert_eq!(
            kind(&[("ContentBasedDeduplication", "true")]),
            ErrorKind::InvalidAttributeName
        );
        assert_eq!(
            kind(&[("FifoQueue", "true")]),
            ErrorKind::UnsupportedOperation
        );
        assert_eq!(
            kind(&[(
                "RedrivePolicy",
                r#"{"maxReceiveCount":3,"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:nope"}"#
            )]),
            ErrorKind::InvalidAttributeValue
        );
        assert_eq!(
            kind(&[(
                "RedrivePolicy",
                r#"{"maxReceiveCount":0,"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:dlq"}"#
            )]),
            ErrorKind::InvalidAttributeValue
        );
        assert_eq!(
            kind(&[("RedrivePolicy", "{")]),
            ErrorKind::InvalidAttributeValue
        );
    }

    #[test]
    fn a_created_queue_maps_onto_an_external_qd_queue() {
        let given = check_attributes(
            &pairs(&[
                ("VisibilityTimeout", "0"),
                (
                    "RedrivePolicy",
                    r#"{"maxReceiveCount":4,"deadLetterTargetArn":"arn:aws:sqs:r:1:dlq"}"#,
                ),
            ]),
            |_| true,
        )
        .expect("valid");
        let q = CreatedQueue::new(given, BTreeMap::new());
        let cfg = q.queue_config("jobs");
        assert_eq!(cfg.executor, ExecutorSpec::External);
        assert_eq!(cfg.lease, Duration::from_secs(1));
        assert!(cfg.heartbeat < cfg.lease);
        assert_eq!(cfg.max_attempts, 4);
        assert_eq!(q.int("DelaySeconds"), 0);
        assert_eq!(q.int("VisibilityTimeout"), 0);
        let back = CreatedQueue::from_record(&q.record("jobs")).expect("round trip");
        assert_eq!(back, q);
        let mut without = q.clone();
        without.set(BTreeMap::from([(
            "RedrivePolicy".to_string(),
            String::new(),
        )]));
        assert_eq!(without.queue_config("jobs").max_attempts, u32::MAX);
    }

    #[test]
    fn a_dead_letter_queues_redrive_allow_policy_decides_its_sources() {
        let dlq = |allow: Option<&str>| {
            let mut attributes = BTreeMap::new();
            if let Some(a) = allow {
                attributes.insert("RedriveAllowPolicy".to_string(), a.to_string());
            }
            CreatedQueue::new(attributes, BTreeMap::new())
        };
        let policy = BTreeMap::from([(
            "RedrivePolicy".to_string(),
            r#"{"deadLetterTargetArn":"arn:aws:sqs:r:1:dlq","maxReceiveCount":3}"#.to_string(),
        )]);
        let check = |q: &CreatedQueue, source: &str| {
            check_redrive_allowed(&policy, source, |arn| {
                (arn == "arn:aws:sqs:r:1:dlq").then_some(q)
            })
        };
        let src = "arn:aws:sqs:r:1:src";
        assert!(check(&dlq(None), src).is_ok());
        assert!(check(&dlq(Some(r#"{"redrivePermission":"allowAll"}"#)), src).is_ok());
        let denied =
            check(&dlq(Some(r#"{"redrivePermission":"denyAll"}"#)), src).expect_err("denyAll");
        assert_eq!(denied.kind, ErrorKind::InvalidParameterValue);
        assert!(denied.message.contains("denyAll"), "{}", denied.message);
        assert!(denied.message.contains(src), "{}", denied.message);
        let by_queue = dlq(Some(
            r#"{"redrivePermission":"byQueue","sourceQueueArns":["arn:aws:sqs:r:1:src"]}"#,
        ));
        assert!(check(&by_queue, src).is_ok());
        let other = check(&by_queue, "arn:aws:sqs:r:1:other").expect_err("not listed");
        assert_eq!(other.kind, ErrorKind::InvalidParameterValue);
        // A file queue (no created queue for the ARN) lets every source.
        assert!(check_redrive_allowed(&policy, src, |_| None).is_ok());
        // No policy, or one being removed, is not checked.
        let removed = BTreeMap::from([("RedrivePolicy".to_string(), String::new())]);
        assert!(check_redrive_allowed(&removed, src, |_| Some(&by_queue)).is_ok());
    }

    #[test]
    fn the_queues_in_force_are_compared_with_the_stored_rows() {
        let text = "[sqs]\nenabled = true\n[queues.file]\nexecutor = { kind = \"external\" }\n";
        let mut config = Config::parse(text, std::path::Path::new("/tmp/qd.toml")).expect("config");
        let a = CreatedQueue::new(BTreeMap::new(), BTreeMap::new()).record("a");
        let file = CreatedQueue::new(BTreeMap::new(), BTreeMap::new()).record("file");
        assert!(in_force(&config, &[]));
        assert!(!in_force(&config, std::slice::from_ref(&a)), "a new row");
        merge(&mut config, std::slice::from_ref(&a));
        assert!(in_force(&config, std::slice::from_ref(&a)));
        // A row named as a file queue is never in force: the file's wins.
        assert!(in_force(&config, &[a.clone(), file]));
        let mut changed = CreatedQueue::from_record(&a).expect("row");
        changed.set(BTreeMap::from([(
            "VisibilityTimeout".to_string(),
            "45".to_string(),
        )]));
        assert!(!in_force(&config, &[changed.record("a")]), "a changed row");
        assert!(!in_force(&config, &[]), "a deleted row");
    }

    #[test]
    fn names_follow_sqs_and_qd_limits() {
        assert!(check_name("orders-1_a").is_ok());
        assert_eq!(
            check_name("a b").expect_err("space").kind,
            ErrorKind::InvalidParameterValue
        );
        assert_eq!(
            check_name("").expect_err("empty").kind,
            ErrorKind::InvalidParameterValue
        );
        assert_eq!(
            check_name(&"a".repeat(65)).expect_err("long").kind,
            ErrorKind::InvalidParameterValue
        );
        assert_eq!(
            check_name("q.fifo").expect_err("fifo").kind,
            ErrorKind::UnsupportedOperation
        );
    }
}
