//! A small filesystem a test can fill up: a `tmpfs` of a few MiB mounted on a temporary
//! directory, to see what a process does when its disk is full.
//!
//! ```no_run
//! use phrony_test_support::small_fs::SmallFs;
//! let Some(mut fs) = SmallFs::mount(16) else { return }; // skipped, with the reason
//! let home = fs.path().join("home"); // put the daemon's files here
//! fs.fill(); // every further write fails with ENOSPC
//! fs.free(); // the space is back
//! # let _ = home;
//! ```
//!
//! - Mounting needs the right to (`root` or `CAP_SYS_ADMIN`); where `mount` is refused,
//!   [`SmallFs::mount`] returns `None` and says why on stderr.
//! - [`fill`](SmallFs::fill) writes a filler file until the filesystem refuses (`ENOSPC`);
//!   [`free`](SmallFs::free) deletes it.
//! - Dropping it unmounts the filesystem (lazily when a process still holds a file on it),
//!   which discards what was on it, and removes the mount point.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The filler file's name in the filesystem's root.
const FILLER: &str = ".phrony-filler";

/// How much [`SmallFs::fill`] writes at a time; the last, partial block is written byte-wise
/// down to 1 byte, so that not even a small write fits afterwards.
const CHUNK: usize = 64 * 1024;

/// Why a small filesystem cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SmallFsError {
    /// Mounting is not permitted here: the test is skipped.
    #[error("cannot mount a tmpfs here ({detail}); the full-disk test needs root or CAP_SYS_ADMIN")]
    NotPermitted {
        /// What `mount` said.
        detail: String,
    },
    /// A step that should have worked failed.
    #[error("{step} failed: {detail}")]
    Failed {
        /// The step.
        step: String,
        /// Its error.
        detail: String,
    },
}

/// A mounted tmpfs of a fixed size; see the [module docs](self).
#[derive(Debug)]
pub struct SmallFs {
    dir: tempfile::TempDir,
    size_mib: u32,
    mounted: bool,
}

impl SmallFs {
    /// Mounts a tmpfs of `size_mib` MiB; `None` (with the reason on stderr) when mounting is
    /// not permitted.
    ///
    /// # Panics
    /// When the mount is permitted but something else fails.
    #[must_use]
    pub fn mount(size_mib: u32) -> Option<Self> {
        match Self::try_mount(size_mib) {
            Ok(fs) => Some(fs),
            Err(error @ SmallFsError::NotPermitted { .. }) => {
                eprintln!("skipping full-disk test: {error}");
                None
            }
            Err(error) => panic!("small filesystem: {error}"),
        }
    }

    /// Mounts a tmpfs of `size_mib` MiB.
    ///
    /// # Errors
    /// [`SmallFsError::NotPermitted`] when `mount` is refused, [`SmallFsError::Failed`] when the
    /// mount point cannot be made.
    pub fn try_mount(size_mib: u32) -> Result<Self, SmallFsError> {
        let dir = tempfile::Builder::new()
            .prefix("phrony-smallfs-")
            .tempdir()
            .map_err(|e| SmallFsError::Failed {
                step: "create the mount point".into(),
                detail: e.to_string(),
            })?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size_mib}m,mode=0700"))
            .arg("phrony-smallfs")
            .arg(dir.path())
            .output()
            .map_err(|e| SmallFsError::NotPermitted {
                detail: format!("cannot run mount: {e}"),
            })?;
        if !out.status.success() {
            return Err(SmallFsError::NotPermitted {
                detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(Self {
            dir,
            size_mib,
            mounted: true,
        })
    }

    /// The mount point.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The size it was mounted with, in MiB.
    #[must_use]
    pub fn size_mib(&self) -> u32 {
        self.size_mib
    }

    fn filler(&self) -> PathBuf {
        self.dir.path().join(FILLER)
    }

    /// Writes the filler file until the filesystem is full (`ENOSPC`) and returns how many bytes
    /// it added. Filling a full filesystem adds nothing.
    ///
    /// # Panics
    /// When a write fails for another reason than a full disk.
    pub fn fill(&mut self) -> u64 {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler())
            .unwrap_or_else(|e| panic!("open {}: {e}", self.filler().display()));
        let chunk = vec![0x5a_u8; CHUNK];
        let mut written = 0u64;
        let mut size = CHUNK;
        // Bounded: the filesystem is at most a few MiB; each round writes or halves `size`.
        while size > 0 {
            match file.write(&chunk[..size]) {
                Ok(0) => size /= 2,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => size /= 2, // ENOSPC
                Err(e) => panic!("fill {}: {e}", self.filler().display()),
            }
        }
        // tmpfs has no delayed allocation: what was written is allocated.
        written
    }

    /// Fills the filesystem, then gives `bytes` of it back (the filler file shortened): about
    /// `bytes` are left free.
    ///
    /// # Panics
    /// As [`fill`](Self::fill), or when the filler cannot be shortened.
    pub fn leave_free(&mut self, bytes: u64) {
        let written = self.fill();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.filler())
            .unwrap_or_else(|e| panic!("open {}: {e}", self.filler().display()));
        let len = file
            .metadata()
            .unwrap_or_else(|e| panic!("stat {}: {e}", self.filler().display()))
            .len();
        assert!(
            written > 0 && len >= bytes,
            "the filler is smaller than {bytes} bytes"
        );
        file.set_len(len - bytes)
            .unwrap_or_else(|e| panic!("shorten {}: {e}", self.filler().display()));
    }

    /// Deletes the filler file: the space [`fill`](Self::fill) took is free again.
    ///
    /// # Panics
    /// When the file exists and cannot be removed.
    pub fn free(&mut self) {
        match std::fs::remove_file(self.filler()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {}: {e}", self.filler().display()),
        }
    }

    /// Bytes still free, from `df` (`None` when it cannot be read).
    #[must_use]
    pub fn available_bytes(&self) -> Option<u64> {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(self.dir.path())
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let unmounted = Command::new("umount")
            .arg(self.dir.path())
            .output()
            .is_ok_and(|o| o.status.success());
        if !unmounted {
            // Still busy (a process holds a file on it): detach it now, it goes when released.
            let lazy = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .output()
                .is_ok_and(|o| o.status.success());
            if !lazy {
                eprintln!(
                    "warning: could not unmount the small filesystem at {}",
                    self.dir.path().display()
                );
            }
        }
        self.mounted = false;
    }
}
