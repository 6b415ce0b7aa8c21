//! `cargo xtask sync-spec <dir>`: copies the spec suites the project runs from a checkout of the
//! public specifications repository into `spec-tests/data/` (ignored by git).

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::fork::remove_dir_if_exists;
use crate::project::Project;

/// The specifications whose test JSON the project runs (`source/<name>/tests/`). Inside each,
/// the runner discovers files by layout, so new files arrive with the next sync.
pub const SUITES: [&str; 15] = [
    "change-streams",
    "client-backpressure",
    "client-side-operations-timeout",
    "collection-management",
    "command-logging-and-monitoring",
    "crud",
    "index-management",
    "retryable-reads",
    "retryable-writes",
    "run-command",
    "server-discovery-and-monitoring",
    "sessions",
    "transactions",
    "unified-test-format",
    "uri-options",
];

/// Copies every `.json` under `<from>/source/<suite>/tests/`; returns the number of files copied.
pub fn sync_spec(project: &Project, from: &Path) -> Result<usize> {
    let source = from.join("source");
    if !source.is_dir() {
        bail!(
            "{} is not a checkout of the specifications repository (no `source/` directory)",
            from.display()
        );
    }
    let data = project.root().join("spec-tests").join("data");
    remove_dir_if_exists(&data)?;
    let mut copied = 0;
    for suite in SUITES {
        let tests = source.join(suite).join("tests");
        if !tests.is_dir() {
            bail!(
                "{} has no suite {suite} (expected {})",
                from.display(),
                tests.display()
            );
        }
        copied += copy_json(&tests, &data.join("source").join(suite).join("tests"))?;
    }
    // Keep the provenance note of a mirror (or the checkout's commit) beside the data.
    let origin = from.join("SOURCE");
    if origin.is_file() {
        fs::copy(&origin, data.join("SOURCE"))?;
    }
    Ok(copied)
}

fn copy_json(from: &Path, to: &Path) -> Result<usize> {
    let mut copied = 0;
    for entry in fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copied += copy_json(&path, &to.join(entry.file_name()))?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "json") {
            fs::create_dir_all(to)?;
            fs::copy(&path, to.join(entry.file_name()))
                .with_context(|| format!("cannot copy {}", path.display()))?;
            copied += 1;
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_json_of_the_listed_suites_only() {
        let spec = tempfile::tempdir().unwrap();
        for suite in SUITES {
            let dir = spec.path().join("source").join(suite).join("tests/unified");
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("a.json"), "{}").unwrap();
            fs::write(dir.join("a.yml"), "").unwrap();
        }
        fs::create_dir_all(spec.path().join("source/other/tests")).unwrap();
        fs::write(spec.path().join("source/other/tests/b.json"), "{}").unwrap();

        let project_dir = tempfile::tempdir().unwrap();
        let project = Project::new(project_dir.path());
        assert_eq!(sync_spec(&project, spec.path()).unwrap(), SUITES.len());
        let data = project_dir.path().join("spec-tests/data/source");
        assert!(data.join("uri-options/tests/unified/a.json").is_file());
        assert!(!data.join("uri-options/tests/unified/a.yml").exists());
        assert!(!data.join("other").exists());
    }

    #[test]
    fn refuses_a_directory_that_is_not_a_checkout() {
        let empty = tempfile::tempdir().unwrap();
        let err = sync_spec(&Project::new(empty.path()), empty.path()).unwrap_err();
        assert!(err.to_string().contains("no `source/` directory"), "{err}");
    }
}
