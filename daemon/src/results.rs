//! The limits of a job's result: what an ack, a command's `$QD_RESULT_FILE` or a
//! webhook's response body hands back, stored on the job's row by the ack's own
//! write ([`crate::job::Transition::result`]). Pure; no messages.

/// The default of a queue's `max_result`: 64 KiB.
pub const DEFAULT_MAX_RESULT: usize = 64 * 1024;
/// The most a queue's `max_result` may be: 1 MiB.
pub const MAX_RESULT_LIMIT: usize = 1024 * 1024;

/// Refuses a result larger than `max` bytes, naming its size: the text an attempt
/// that produced it fails with (permanent), or an external ack's 400.
pub fn check_result(len: usize, max: usize) -> Result<(), String> {
    if len > max {
        return Err(format!(
            "result of {len} bytes is larger than the queue's max_result of {max} bytes"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_over_the_limit_is_refused_naming_its_size() {
        assert_eq!(check_result(10, 10), Ok(()));
        let err = check_result(11, 10).expect_err("over");
        assert!(
            err.contains("11 bytes") && err.contains("10 bytes"),
            "{err}"
        );
    }
}
