//! The fork workflow: build `driver/` from upstream plus the series, export it back, check that
//! the two agree.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::git::Git;
use crate::pristine::{self, CrateSource};
use crate::project::{Project, Upstream};
use crate::series::{self, Patch};

/// What the commands work on: the project, the git to run, and where upstream crates come from.
pub struct Workspace {
    pub project: Project,
    pub git: Git,
    pub source: Box<dyn CrateSource>,
}

/// The tag `driver` and `export` put on the commit where `driver/` last equalled `patches/`.
/// Commits up to it came from the series, so replacing them (after a pull brought a newer
/// series) loses nothing; only commits after it can be a developer's unexported work.
const IN_SYNC_TAG: &str = "xtask-in-sync";

/// What `driver` did.
#[derive(Debug, PartialEq, Eq)]
pub enum DriverOutcome {
    /// `driver/` already held exactly the pinned upstream plus the series.
    UpToDate,
    /// `driver/` was (re)built; this many patches were applied.
    Built { patches: usize },
}

/// The message of the base commit; `driver` compares it to tell whether `driver/` was built from
/// the archive `UPSTREAM` pins now.
pub(crate) fn base_message(upstream: &Upstream) -> String {
    let sha = upstream.sha256.as_deref().unwrap_or("not pinned");
    format!("{upstream} from crates.io (pristine)\n\nsha256 {sha}")
}

impl Workspace {
    fn driver(&self) -> PathBuf {
        self.project.driver_dir()
    }

    /// `cargo xtask driver`: makes `driver/` the pinned upstream crate with the series applied.
    ///
    /// Refuses, unless `force`, to replace a `driver/` holding uncommitted changes or commits that
    /// `patches/` does not have. Does nothing when `driver/` already matches.
    pub fn build_driver(&self, force: bool) -> Result<DriverOutcome> {
        self.git.ensure_available()?;
        let upstream = self.project.upstream()?;
        let patches = series::read(&self.project)?;
        let driver = self.driver();

        if driver.exists() && !force {
            self.ensure_nothing_unexported(&patches)?;
            if self.base_is(&upstream)?
                && same_series(&series::render(&self.git, &driver)?, &patches)
            {
                self.mark_in_sync()?;
                return Ok(DriverOutcome::UpToDate);
            }
        }

        // Build beside the old tree and swap, so a failed download leaves driver/ as it was.
        let staging = self.project.root().join(".driver.staging");
        remove_dir_if_exists(&staging)?;
        pristine::unpack_verified(self.source.as_ref(), &upstream, &staging)?;
        self.git.init_base(&staging, &base_message(&upstream))?;
        remove_dir_if_exists(&driver)?;
        fs::rename(&staging, &driver)
            .with_context(|| format!("cannot move the new tree to {}", driver.display()))?;

        for patch in &patches {
            let path = self.project.patches_dir().join(&patch.file);
            if let Err(err) = self.git.am(&driver, &path) {
                bail!(
                    "patch {} does not apply to {upstream}:\n{err:#}\n\ndriver/ is left in the middle \
                     of `git am` for inspection (`git -C driver am --show-current-patch=diff`). Fix the \
                     patch, then run `cargo xtask driver --force`.",
                    patch.file
                );
            }
        }
        self.mark_in_sync()?;
        Ok(DriverOutcome::Built {
            patches: patches.len(),
        })
    }

    /// Fails when `driver/` holds work that `patches/` lacks: uncommitted changes, or commits whose
    /// patch is not in the series.
    fn ensure_nothing_unexported(&self, patches: &[Patch]) -> Result<()> {
        let driver = self.driver();
        if !driver.join(".git").exists() {
            bail!(
                "driver/ exists but is not a git repository, so xtask cannot tell whether it holds \
                 work; move it away or pass --force to replace it"
            );
        }
        let dirty = self.git.uncommitted(&driver)?;
        if !dirty.trim().is_empty() {
            bail!(
                "driver/ has uncommitted changes; commit them inside driver/ and run `cargo xtask \
                 export`, or pass --force to discard them:\n{}",
                dirty.trim_end()
            );
        }
        if self.is_at_in_sync_tag()? {
            return Ok(());
        }
        let rendered = series::render(&self.git, &driver).context(
            "cannot list driver/'s commits (is the `upstream` tag missing?); pass --force to rebuild",
        )?;
        let unexported: Vec<String> = rendered
            .iter()
            .filter(|r| {
                !patches
                    .iter()
                    .any(|p| series::normalized(&p.text) == series::normalized(&r.text))
            })
            .map(|r| format!("  {}", series::subject(&r.text)))
            .collect();
        if !unexported.is_empty() {
            bail!(
                "driver/ holds commits that patches/ does not have:\n{}\nRun `cargo xtask export` to keep \
                 them, or pass --force to discard them.",
                unexported.join("\n")
            );
        }
        Ok(())
    }

    fn mark_in_sync(&self) -> Result<()> {
        self.git
            .run(&self.driver(), ["tag", "--force", IN_SYNC_TAG, "HEAD"])
            .map(drop)
    }

    fn is_at_in_sync_tag(&self) -> Result<bool> {
        let driver = self.driver();
        let head = self.git.output(&driver, ["rev-parse", "HEAD"])?;
        let tag = self
            .git
            .output(&driver, ["rev-parse", &format!("{IN_SYNC_TAG}^{{commit}}")])?;
        Ok(head.status.success() && tag.status.success() && head.stdout == tag.stdout)
    }

    fn base_is(&self, upstream: &Upstream) -> Result<bool> {
        let out = self
            .git
            .output(&self.driver(), ["log", "-1", "--format=%B", "upstream"])?;
        Ok(out.status.success()
            && String::from_utf8_lossy(&out.stdout).trim() == base_message(upstream))
    }

    fn ensure_driver_repo(&self) -> Result<()> {
        self.git.ensure_available()?;
        let driver = self.driver();
        if !driver.join(".git").exists() {
            bail!(
                "driver/ does not exist or is not a git repository; run `cargo xtask driver` first"
            );
        }
        Ok(())
    }

    /// `cargo xtask export`: rewrites `patches/` from `upstream..HEAD` of `driver/`. Refuses when
    /// `driver/` has uncommitted changes or a commit message lacks its why or DEP-3 fields, and
    /// then leaves `patches/` untouched. Returns a line per added, changed or removed file.
    pub fn export(&self) -> Result<Vec<String>> {
        self.ensure_driver_repo()?;
        let driver = self.driver();
        let dirty = self.git.uncommitted(&driver)?;
        if !dirty.trim().is_empty() {
            bail!(
                "driver/ has uncommitted changes; commit them first:\n{}",
                dirty.trim_end()
            );
        }
        let rendered = series::render(&self.git, &driver)?;
        let defects = series::DefectAnchors::read(&self.project)?;
        let problems: Vec<String> = rendered
            .iter()
            .flat_map(|p| {
                series::lint(p, &defects).into_iter().map(move |problem| {
                    format!("  commit `{}`: {problem}", series::subject(&p.text))
                })
            })
            .collect();
        if !problems.is_empty() {
            bail!(
                "not exported; patches/ is unchanged. Fix these commit messages inside driver/ \
                 (`git commit --amend` or `git rebase -i upstream`):\n{}",
                problems.join("\n")
            );
        }

        let dir = self.project.patches_dir();
        let mut report = Vec::new();
        for patch in &rendered {
            let path = dir.join(&patch.file);
            match fs::read_to_string(&path) {
                Ok(old) if old == patch.text => {}
                Ok(_) => report.push(format!("changed {}", patch.file)),
                Err(_) => report.push(format!("added {}", patch.file)),
            }
            fs::write(&path, &patch.text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        for entry in fs::read_dir(&dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".patch") && !rendered.iter().any(|p| p.file == name) {
                fs::remove_file(dir.join(&name))?;
                report.push(format!("removed {name}"));
            }
        }
        let mut series_text = String::from(
            "# The fork's patches, in the order `cargo xtask driver` applies them.\n\
             # Written by `cargo xtask export`; see docs/patch-workflow.md.\n",
        );
        for patch in &rendered {
            series_text.push_str(&patch.file);
            series_text.push('\n');
        }
        if fs::read_to_string(self.project.series_file())
            .ok()
            .as_deref()
            != Some(series_text.as_str())
        {
            report.push("changed series".to_owned());
            fs::write(self.project.series_file(), series_text)?;
        }
        self.mark_in_sync()?;
        Ok(report)
    }

    /// `cargo xtask check`: every way `patches/` and `driver/` can disagree, reported together.
    pub fn check(&self) -> Result<()> {
        self.ensure_driver_repo()?;
        let driver = self.driver();
        let upstream = self.project.upstream()?;
        let mut problems = Vec::new();

        let dirty = self.git.uncommitted(&driver)?;
        if !dirty.trim().is_empty() {
            problems.push(format!(
                "driver/ has uncommitted changes (commit them, then `cargo xtask export`):\n{}",
                indent(dirty.trim_end())
            ));
        }
        let patches = series::read(&self.project)?;
        let defects = series::DefectAnchors::read(&self.project)?;
        for patch in &patches {
            for problem in series::lint(patch, &defects) {
                problems.push(format!("patches/{}: {problem}", patch.file));
            }
        }
        problems.extend(compare_series(
            &series::render(&self.git, &driver)?,
            &patches,
        ));

        // The series applied to a fresh pristine copy must give driver/'s tree exactly.
        let scratch = tempfile::tempdir()?;
        let fresh = scratch.path().join("driver");
        pristine::unpack_verified(self.source.as_ref(), &upstream, &fresh)?;
        self.git.init_base(&fresh, &base_message(&upstream))?;
        if self.git.tree_of(&fresh, "HEAD")? != self.git.tree_of(&driver, "upstream")? {
            problems.push(format!(
                "driver/'s `upstream` commit is not pristine {upstream}; rebuild with `cargo xtask driver --force`"
            ));
        }
        let mut applied_all = true;
        for patch in &patches {
            if let Err(err) = self
                .git
                .am(&fresh, &self.project.patches_dir().join(&patch.file))
            {
                problems.push(format!(
                    "patches/{} does not apply to pristine {upstream}:\n{}",
                    patch.file,
                    indent(&format!("{err:#}"))
                ));
                applied_all = false;
                break;
            }
        }
        if applied_all && self.git.tree_of(&fresh, "HEAD")? != self.git.tree_of(&driver, "HEAD")? {
            problems.push(
                "the series applied to pristine upstream does not give driver/'s tree; export \
                 driver/ or rebuild it with `cargo xtask driver --force`"
                    .to_owned(),
            );
        }

        if problems.is_empty() {
            Ok(())
        } else {
            bail!(
                "{} problem(s):\n- {}",
                problems.len(),
                problems.join("\n- ")
            )
        }
    }
}

fn same_series(rendered: &[Patch], patches: &[Patch]) -> bool {
    compare_series(rendered, patches).is_empty()
}

/// Differences between driver/'s commits (rendered) and patches/, one message each, naming files.
fn compare_series(rendered: &[Patch], patches: &[Patch]) -> Vec<String> {
    let mut problems = Vec::new();
    for r in rendered {
        match patches.iter().find(|p| p.file == r.file) {
            None => problems.push(format!(
                "driver/ commit `{}` is not exported (run `cargo xtask export`)",
                series::subject(&r.text)
            )),
            Some(p) if series::normalized(&p.text) != series::normalized(&r.text) => {
                problems.push(format!(
                "patches/{} differs from driver/'s commit `{}`: run `cargo xtask export` to keep \
                 driver/, or `cargo xtask driver --force` to rebuild driver/ from patches/",
                p.file,
                series::subject(&r.text)
            ))
            }
            Some(_) => {}
        }
    }
    for p in patches {
        if !rendered.iter().any(|r| r.file == p.file) {
            problems.push(format!(
                "patches/{} is not in driver/ (run `cargo xtask driver` to apply it)",
                p.file
            ));
        }
    }
    let order = |list: &[Patch]| list.iter().map(|p| p.file.clone()).collect::<Vec<_>>();
    if problems.is_empty() && order(rendered) != order(patches) {
        problems.push(
            "patches/series orders the patches differently from driver/'s commits".to_owned(),
        );
    }
    problems
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err).with_context(|| format!("cannot remove {}", dir.display())),
    }
}
