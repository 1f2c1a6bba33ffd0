//! Test helpers of the `bundles` commands: the bundle fixture of the end-to-end tests
//! (`tests/fixtures/bundles/refund-desk`), copied into a scratch directory.

use std::path::Path;

/// The fixture's directory in the workspace.
fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bundles/refund-desk")
}

/// Copies the fixture (bundle.yaml, its agents, tools and policies, without its committed
/// lock) into `dir`.
///
/// # Panics
/// When a file cannot be copied.
pub(crate) fn copy_fixture(dir: &Path) {
    copy_dir(&fixture(), dir);
    let lock = dir.join(phrony_manifest::LOCK_FILE);
    if lock.exists() {
        std::fs::remove_file(&lock).unwrap_or_else(|e| panic!("remove {}: {e}", lock.display()));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("read {}: {e}", from.display()))
            .path();
        let target = to.join(path.file_name().unwrap_or_default());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
        }
    }
}
