//! `$QD_PARENTS_FILE`: the file from which a command job reads its parents and
//! their results, the same JSON list an external worker's lease carries
//! (`[{"id", "state", "result" | "result_b64", "last_error"}, ...]`, `[]` for a
//! job without parents). One file per attempt, created private (0600) in the
//! temporary directory and written before the child starts, removed when the
//! attempt ends. No messages; owned by the command executor for one attempt.

use std::io::Write;
use std::path::Path;

use tempfile::NamedTempFile;

use crate::results::ParentBody;

/// The environment variable naming the file.
pub const ENV: &str = "QD_PARENTS_FILE";

/// One attempt's parents file.
pub struct ParentsFile {
    file: NamedTempFile,
}

impl ParentsFile {
    /// Creates the attempt's private file holding `parents` as JSON.
    pub fn create(parents: &[ParentBody]) -> std::io::Result<ParentsFile> {
        let mut file = tempfile::Builder::new().prefix("qd-parents-").tempfile()?;
        serde_json::to_writer(&mut file, parents)?;
        file.flush()?;
        Ok(ParentsFile { file })
    }

    /// Where the child reads.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_file_is_private_holds_the_list_and_goes_with_the_attempt() {
        let file = ParentsFile::create(&[]).expect("create");
        let path = file.path().to_owned();
        assert_eq!(std::fs::read(&path).expect("read"), b"[]");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(file);
        assert!(!path.exists(), "removed when the attempt ends");
    }
}
