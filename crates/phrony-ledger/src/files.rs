//! The SQLite database's files on disk: owner-only, whatever the process umask.
//!
//! The database holds tool arguments, approvals and comments, so its directory is created
//! `0700` and the database file `0600` before SQLite opens it; SQLite gives the `-wal` and
//! `-shm` files it creates the database file's mode. Files left with wider modes by an
//! earlier release (`0644` under the usual umask) are tightened to `0600` when the ledger
//! opens them, with a warning naming each file. A directory that already exists is left
//! alone (it may be shared, like `/tmp`). Other platforms keep their defaults.

use std::path::Path;

use crate::error::{LedgerError, Result};

/// Mode of the SQLite database file and its `-wal`/`-shm` companions.
#[cfg(unix)]
const FILE_MODE: u32 = 0o600;

/// Mode of directories created for the database.
#[cfg(unix)]
const DIR_MODE: u32 = 0o700;

/// Makes `file` ready to open: its missing parent directories created owner-only, the file
/// itself created `0600` when `create` and it does not exist, and existing database files
/// with group or other permissions tightened to `0600`.
pub(crate) fn prepare_sqlite_file(file: &Path, create: bool) -> Result<()> {
    create_parent_dir(file)?;
    if create {
        create_file(file)?;
    }
    for path in companions(file) {
        tighten(&path)?;
    }
    Ok(())
}

/// The database file and the files SQLite keeps next to it.
fn companions(file: &Path) -> Vec<std::path::PathBuf> {
    let mut paths = vec![file.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut name = file.as_os_str().to_owned();
        name.push(suffix);
        paths.push(name.into());
    }
    paths
}

fn create_parent_dir(file: &Path) -> Result<()> {
    let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(parent).map_err(|e| LedgerError::Config {
        message: format!(
            "cannot create directory {} for the SQLite database: {e}",
            parent.display()
        ),
    })
}

fn create_file(file: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
    match options.open(file) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(LedgerError::Config {
            message: format!("cannot create SQLite database {}: {e}", file.display()),
        }),
    }
}

#[cfg(unix)]
fn tighten(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let metadata = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(LedgerError::Config {
                message: format!("cannot read the permissions of {}: {e}", path.display()),
            });
        }
    };
    let mode = metadata.permissions().mode() & 0o777;
    if !metadata.is_file() || mode & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(FILE_MODE)).map_err(|e| {
        LedgerError::Config {
            message: format!(
                "{} is readable by other users (mode {mode:o}) and cannot be made owner-only: {e}",
                path.display()
            ),
        }
    })?;
    tracing::warn!(
        path = %path.display(),
        old_mode = %format!("{mode:o}"),
        "database file was readable by other users; its mode is now 600 (owner-only)"
    );
    Ok(())
}

#[cfg(not(unix))]
#[allow(
    clippy::unnecessary_wraps,
    reason = "the same signature as the unix version"
)]
fn tighten(_path: &Path) -> Result<()> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn new_files_and_directories_are_owner_only_and_old_ones_are_tightened() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data/nested/phrony.db");
        prepare_sqlite_file(&file, true).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&dir.path().join("data/nested")), 0o700);
        assert_eq!(mode(&dir.path().join("data")), 0o700);

        let wal = dir.path().join("data/nested/phrony.db-wal");
        std::fs::write(&wal, b"").unwrap();
        std::fs::set_permissions(&wal, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).unwrap();
        prepare_sqlite_file(&file, true).unwrap();
        assert_eq!((mode(&file), mode(&wal)), (0o600, 0o600));
    }
}
