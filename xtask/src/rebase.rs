//! `cargo xtask rebase <version>`: how the series fares on another upstream release.
//!
//! The trial runs in `target/xtask/rebase-<version>/`, a repository with two roots: the pinned
//! upstream with the series applied (branch `fork`), and the other release (branch `main`, tag
//! `upstream`). Each fork commit is cherry-picked onto the other release, so git merges with the
//! real common base instead of applying diffs blindly; the result stays there for inspection.

use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::fork::{base_message, remove_dir_if_exists, Workspace};
use crate::pristine;
use crate::project::Upstream;
use crate::series;

#[derive(Debug, PartialEq, Eq)]
pub enum PatchFate {
    Applied,
    /// Upstream already contains the change: the cherry-pick was empty.
    AlreadyUpstream,
    /// The files git could not merge.
    Conflicting(Vec<String>),
}

pub struct RebaseReport {
    pub target: Upstream,
    pub results: Vec<(String, PatchFate)>,
    pub repo: std::path::PathBuf,
}

impl RebaseReport {
    pub fn conflicts(&self) -> usize {
        self.results
            .iter()
            .filter(|(_, f)| matches!(f, PatchFate::Conflicting(_)))
            .count()
    }
}

impl Workspace {
    pub fn rebase(&self, version: &str) -> Result<RebaseReport> {
        self.git.ensure_available()?;
        let current = self.project.upstream()?;
        let target = Upstream::unpinned(&current.krate, version);
        let patches = series::read(&self.project)?;
        let repo = self.project.scratch_dir().join(format!("rebase-{version}"));
        remove_dir_if_exists(&repo)?;

        // Branch `fork`: the pinned release plus the series, as `driver` builds it.
        pristine::unpack_verified(self.source.as_ref(), &current, &repo)?;
        self.git.init_base(&repo, &base_message(&current))?;
        self.git.run(&repo, ["tag", "--delete", "upstream"])?;
        for patch in &patches {
            self.git
                .am(&repo, &self.project.patches_dir().join(&patch.file))
                .with_context(|| {
                    format!(
                        "patches/{} does not apply to {current}; run `cargo xtask check`",
                        patch.file
                    )
                })?;
        }
        self.git.run(&repo, ["branch", "--move", "fork"])?;
        let commits: Vec<String> = self
            .git
            .run(&repo, ["rev-list", "--reverse", "fork"])?
            .lines()
            .skip(1) // the pristine base
            .map(str::to_owned)
            .collect();

        // Branch `main`: the other release, as an unrelated root.
        self.git
            .run(&repo, ["checkout", "--quiet", "--orphan", "main"])?;
        self.git
            .run(&repo, ["rm", "-r", "--quiet", "--force", "--cached", "."])?;
        clear_work_tree(&repo)?;
        pristine::unpack_verified(self.source.as_ref(), &target, &repo)?;
        self.git.run(&repo, ["add", "--all", "--force"])?;
        self.git.run(
            &repo,
            [
                "commit",
                "--quiet",
                "--no-verify",
                "-m",
                &base_message(&target),
            ],
        )?;
        self.git.run(&repo, ["tag", "upstream"])?;

        let mut results = Vec::new();
        for (commit, patch) in commits.iter().zip(&patches) {
            let out = self
                .git
                .output(&repo, ["cherry-pick", "--allow-empty-message", commit])?;
            let fate = if out.status.success() {
                PatchFate::Applied
            } else {
                let conflicted = self
                    .git
                    .run(&repo, ["diff", "--name-only", "--diff-filter=U"])?;
                let files: Vec<String> = conflicted.lines().map(str::to_owned).collect();
                if files.is_empty() {
                    // Nothing conflicts, so the pick failed for being empty: upstream has it.
                    self.git.run(&repo, ["cherry-pick", "--skip"])?;
                    PatchFate::AlreadyUpstream
                } else {
                    self.git.run(&repo, ["cherry-pick", "--abort"])?;
                    PatchFate::Conflicting(files)
                }
            };
            results.push((patch.file.clone(), fate));
        }
        if commits.len() != patches.len() {
            bail!(
                "the series has {} patches but applying it made {} commits",
                patches.len(),
                commits.len()
            );
        }
        Ok(RebaseReport {
            target,
            results,
            repo,
        })
    }
}

fn clear_work_tree(repo: &Path) -> Result<()> {
    for entry in fs::read_dir(repo)? {
        let entry = entry?;
        if entry.file_name() == ".git" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}
