//! Enqueue timestamps carried inside payloads, and percentiles of latencies.
//!
//! A producer writes the wall-clock time (µs since the Unix epoch, 16 hex digits
//! after a `T`) into the first bytes of each payload just before it sends the put;
//! a consumer reads it back from the leased payload, so enqueue→lease and
//! enqueue→ack need no shared table between producers and consumers, and the same
//! payload works for qd and for beanstalkd. The latencies include the put's own
//! round trip.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Bytes the stamp takes at the front of a payload: `T` + 16 hex digits.
pub const STAMP_LEN: usize = 17;

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A payload of `size` bytes (at least [`STAMP_LEN`]) stamped with `at_us`; the rest
/// is `x` filler, so it needs no JSON escaping.
pub fn stamped_payload(size: usize, at_us: u64) -> Vec<u8> {
    let mut payload = format!("T{at_us:016x}").into_bytes();
    payload.resize(size.max(STAMP_LEN), b'x');
    payload
}

/// The stamp at the front of `payload`, if it carries one.
pub fn read_stamp(payload: &[u8]) -> Option<u64> {
    let digits = payload.get(1..STAMP_LEN).filter(|_| payload[0] == b'T')?;
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// Percentiles of a set of latencies, in microseconds (nearest rank).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// How many samples.
    pub n: usize,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest sample.
    pub max: u64,
}

impl Percentiles {
    /// Percentiles of `samples` (µs); all zero when there are none.
    pub fn of(mut samples: Vec<u64>) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let at = |p: f64| samples[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Percentiles {
            n,
            p50: at(0.50),
            p99: at(0.99),
            max: samples[n - 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_survives_the_round_trip_and_filler_is_not_a_stamp() {
        let p = stamped_payload(100, 1_764_530_000_123_456);
        assert_eq!(p.len(), 100);
        assert_eq!(read_stamp(&p), Some(1_764_530_000_123_456));
        assert_eq!(stamped_payload(3, 7).len(), STAMP_LEN);
        assert_eq!(read_stamp(b"xxxxxxxxxxxxxxxxxxxxx"), None);
        assert_eq!(read_stamp(b"T12"), None);
        assert_eq!(read_stamp(b"Tzzzzzzzzzzzzzzzz"), None);
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let p = Percentiles::of((1..=100).collect());
        assert_eq!((p.n, p.p50, p.p99, p.max), (100, 50, 99, 100));
        assert_eq!(Percentiles::of(vec![]), Percentiles::default());
        assert_eq!(Percentiles::of(vec![5]).p99, 5);
    }
}
