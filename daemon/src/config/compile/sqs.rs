//! `[sqs]`: the SQS-compatible API's account, region and queue URL base.

use std::net::SocketAddr;

use super::super::SqsConfig;
use super::super::diag::{Diagnostics, KeyPath};
use super::super::raw::RawSqs;

/// The account id in queue URLs and ARNs when none is configured (ElasticMQ's and
/// LocalStack's too, so SDK examples written for them work unchanged).
const DEFAULT_ACCOUNT: &str = "000000000000";

/// Compiles `[sqs]`, recording a problem for an account id that is not 12 digits,
/// a region that is not lower-case letters, digits and dashes, or an advertised URL
/// that is not `http(s)://host[:port][/path]`.
pub(super) fn compile_sqs(
    diag: &mut Diagnostics<'_>,
    raw: &RawSqs,
    api_listen: SocketAddr,
) -> SqsConfig {
    let at = |key: &str| KeyPath::of(&["sqs", key]);
    let account_id = raw
        .account_id
        .clone()
        .unwrap_or_else(|| DEFAULT_ACCOUNT.into());
    if account_id.len() != 12 || !account_id.bytes().all(|b| b.is_ascii_digit()) {
        diag.error(
            &at("account_id"),
            format!("account_id {account_id:?} must be 12 digits, e.g. \"000000000000\""),
        );
    }
    let region = raw.region.clone().unwrap_or_else(|| "us-east-1".into());
    let region_ok = !region.is_empty()
        && region.len() <= 32
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !region_ok {
        diag.error(
            &at("region"),
            format!("region {region:?} must be like \"us-east-1\" (a-z, 0-9 and -)"),
        );
    }
    let advertised_url = match &raw.advertised_url {
        None => format!("http://{api_listen}"),
        Some(url) => {
            let trimmed = url.trim_end_matches('/').to_string();
            let rest = trimmed
                .strip_prefix("http://")
                .or_else(|| trimmed.strip_prefix("https://"));
            if !rest.is_some_and(|r| !r.is_empty() && !r.contains(char::is_whitespace)) {
                diag.error(
                    &at("advertised_url"),
                    format!(
                        "advertised_url {url:?} must be an http:// or https:// URL, e.g. \"http://qd.internal:7070\""
                    ),
                );
            }
            trimmed
        }
    };
    SqsConfig {
        enabled: raw.enabled.unwrap_or(false),
        account_id,
        region,
        advertised_url,
        created: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    const QUEUE: &str = "[queues.a]\nexecutor = { kind = \"external\" }\n";

    #[test]
    fn defaults_follow_api_listen() {
        let text =
            format!("[daemon]\napi_listen = \"127.0.0.1:7171\"\n{QUEUE}[sqs]\nenabled = true\n");
        let c = Config::parse(&text, Path::new("/tmp/qd.toml")).expect("valid");
        assert!(c.sqs.enabled);
        assert_eq!(c.sqs.account_id, "000000000000");
        assert_eq!(c.sqs.region, "us-east-1");
        assert_eq!(c.sqs.advertised_url, "http://127.0.0.1:7171");
    }

    #[test]
    fn every_bad_key_is_reported_at_once() {
        let text = format!(
            "{QUEUE}[sqs]\naccount_id = \"12\"\nregion = \"US East\"\nadvertised_url = \"ftp://x\"\ncolour = 1\n"
        );
        let errors = Config::parse(&text, Path::new("/tmp/qd.toml")).expect_err("invalid");
        let all = errors.to_string();
        for key in [
            "sqs.account_id",
            "sqs.region",
            "sqs.advertised_url",
            "colour",
        ] {
            assert!(all.contains(key), "{key} not reported in:\n{all}");
        }
    }
}
