//! The free-space floor of a SQLite database's filesystem.
//!
//! A full disk does not corrupt a SQLite database in WAL mode, but it fails whichever write
//! first needs a new page, and until then writes that fit in space the files already have go
//! through: the WAL is reused from its start after each checkpoint, and pages freed inside the
//! database are reused too. So a full disk shows up late and unevenly — a write that grows the
//! database fails while the health probe, which rewrites one row, keeps succeeding. The ledger
//! instead keeps a reserve: while the filesystem holding the database has less than
//! [`crate::LedgerOptions::sqlite_min_free_bytes`] available to this process, every write
//! batch and the write probe fail with [`LedgerError::Unavailable`] before they begin (nothing
//! is written, so nothing is half-written), health turns `NOT_SERVING`, and both recover by
//! themselves once space is freed. The reserve also leaves room for the WAL checkpoint, which
//! grows the database file by the pages it copies into it.

use std::path::{Path, PathBuf};

use crate::error::{LedgerError, Result};

/// The reserve when [`crate::LedgerOptions`] does not say otherwise: 32 MiB, twice the largest
/// WAL the automatic checkpoint lets accumulate (`checkpoint::AUTOCHECKPOINT_PAGES` pages of
/// 4 KiB), so that the checkpoint of a full WAL still fits.
pub(crate) const DEFAULT_MIN_FREE_BYTES: u64 = 32 * 1024 * 1024;

/// Checks the space left on the filesystem of one database file.
#[derive(Debug, Clone)]
pub(crate) struct DiskFloor {
    /// The database file's directory (its WAL and shared-memory files live there too).
    dir: PathBuf,
    /// The database file, for messages.
    file: PathBuf,
    /// The least space the filesystem must have available for a write to begin.
    min_free: u64,
}

impl DiskFloor {
    /// The floor of the filesystem holding `file`; `None` when `min_free` is 0 (no reserve).
    pub(crate) fn new(file: &Path, min_free: u64) -> Option<Self> {
        if min_free == 0 {
            return None;
        }
        let dir = match file.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Some(Self {
            dir,
            file: file.to_path_buf(),
            min_free,
        })
    }

    /// `Err(Unavailable)` when the filesystem has less than the reserve available. When the
    /// free space cannot be read (the directory is gone, the call is not supported) it does not
    /// refuse: the write itself reports what is wrong.
    pub(crate) fn check(&self, context: &str) -> Result<()> {
        let Some(free) = available_bytes(&self.dir) else {
            return Ok(());
        };
        if free >= self.min_free {
            return Ok(());
        }
        Err(LedgerError::Unavailable {
            context: context.to_owned(),
            error: sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "the filesystem holding {} has {free} bytes available, below the {} bytes \
                     the ledger keeps in reserve (RUNTIME_SQLITE_MIN_FREE_BYTES); writes resume \
                     once space is freed",
                    self.file.display(),
                    self.min_free
                ),
            )),
        })
    }
}

/// The bytes of `dir`'s filesystem available to an unprivileged process, or `None` when they
/// cannot be read.
#[cfg(unix)]
fn available_bytes(dir: &Path) -> Option<u64> {
    match rustix::fs::statvfs(dir) {
        Ok(stats) => Some(stats.f_bavail.saturating_mul(stats.f_frsize)),
        Err(error) => {
            tracing::debug!(%error, dir = %dir.display(), "cannot read the free space");
            None
        }
    }
}

#[cfg(not(unix))]
fn available_bytes(_dir: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_larger_than_the_filesystem_refuses_and_names_the_file_and_setting() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("ledger.db");
        let floor = DiskFloor::new(&file, u64::MAX).expect("a reserve");
        let error = floor
            .check("ledger write")
            .expect_err("no disk has u64::MAX bytes");
        assert!(error.is_unavailable(), "{error:?}");
        let text = error.to_string();
        assert!(text.starts_with("ledger write: "), "{text}");
        assert!(text.contains(&file.display().to_string()), "{text}");
        assert!(text.contains("RUNTIME_SQLITE_MIN_FREE_BYTES"), "{text}");

        let small = DiskFloor::new(&file, 1).expect("a reserve");
        small
            .check("ledger write")
            .expect("a temp dir has a byte free");
        assert!(DiskFloor::new(&file, 0).is_none(), "0 is no reserve");
    }

    #[test]
    fn a_bare_file_name_is_checked_in_the_working_directory() {
        let floor = DiskFloor::new(Path::new("phrony.db"), 1).expect("a reserve");
        assert_eq!(floor.dir, PathBuf::from("."));
        floor
            .check("ledger write")
            .expect("the working directory has a byte free");
    }
}
