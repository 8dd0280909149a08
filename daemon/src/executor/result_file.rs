//! `$QD_RESULT_FILE`: the file a command job writes its result to. One empty file
//! per attempt, created private (0600) in the temporary directory before the child
//! starts, read after the child exited 0, and removed when the attempt ends. An
//! empty file (or one the child removed) is no result; one larger than the
//! queue's `max_result` fails the attempt as permanent, naming its size. No
//! messages; owned by the command executor for one attempt.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use tempfile::NamedTempFile;

use crate::job::Failure;

/// The environment variable naming the file.
pub const ENV: &str = "QD_RESULT_FILE";

/// One attempt's result file.
pub struct ResultFile {
    file: NamedTempFile,
}

impl ResultFile {
    /// Creates the attempt's empty, private file.
    pub fn create() -> std::io::Result<ResultFile> {
        let file = tempfile::Builder::new().prefix("qd-result-").tempfile()?;
        Ok(ResultFile { file })
    }

    /// Where the child writes.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The result the child left: `None` for an empty or missing file, a
    /// permanent failure for one above `max` bytes or one that cannot be read (a
    /// symlink is not followed: the result is what the child wrote, not a file it
    /// pointed at).
    pub fn take(&self, max: usize) -> Result<Option<Vec<u8>>, Failure> {
        let path = self.path();
        let unreadable = |e: std::io::Error| Failure::Permanent {
            error: format!("cannot read the result file {}: {e}", path.display()),
        };
        let mut file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(e)),
        };
        let len = file.metadata().map_err(unreadable)?.len();
        let too_large = |len: u64| Failure::Permanent {
            error: crate::results::check_result(usize::try_from(len).unwrap_or(usize::MAX), max)
                .err()
                .unwrap_or_default(),
        };
        if len > max as u64 {
            return Err(too_large(len));
        }
        // Read one byte past the limit: the file may grow between the two looks.
        let mut body = Vec::with_capacity(len as usize);
        (&mut file)
            .take(max as u64 + 1)
            .read_to_end(&mut body)
            .map_err(unreadable)?;
        if body.len() > max {
            return Err(too_large(body.len() as u64));
        }
        Ok((!body.is_empty()).then_some(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_removed_file_is_no_result_and_a_large_one_fails_naming_its_size() {
        let file = ResultFile::create().expect("create");
        assert_eq!(file.take(10), Ok(None), "empty");
        std::fs::write(file.path(), b"0123456789").expect("write");
        assert_eq!(file.take(10), Ok(Some(b"0123456789".to_vec())));
        std::fs::write(file.path(), b"0123456789A").expect("write");
        match file.take(10) {
            Err(Failure::Permanent { error }) => {
                assert!(error.contains("11 bytes"), "{error}")
            }
            other => panic!("expected a permanent failure, got {other:?}"),
        }
        std::fs::remove_file(file.path()).expect("remove");
        assert_eq!(file.take(10), Ok(None), "removed");
    }

    #[test]
    fn a_symlink_in_place_of_the_file_is_not_followed() {
        let file = ResultFile::create().expect("create");
        let target = tempfile::NamedTempFile::new().expect("target");
        std::fs::write(target.path(), b"secret").expect("write");
        std::fs::remove_file(file.path()).expect("remove");
        std::os::unix::fs::symlink(target.path(), file.path()).expect("symlink");
        assert!(
            matches!(file.take(100), Err(Failure::Permanent { .. })),
            "refused"
        );
    }
}
