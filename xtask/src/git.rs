//! Running git with settings that make its output the same on every machine.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

/// The identity xtask commits under (the upstream base commit, patches applied with `git am`).
/// Authors of patches keep their own identity: `git am` copies it from the patch.
const XTASK_NAME: &str = "mongodb-overload xtask";
const XTASK_EMAIL: &str = "xtask@mongodb-overload.invalid";

/// A git executable. Global and system configuration are ignored so that a developer's
/// `format.*`, `diff.*` or signing settings cannot change exported patches or tree hashes.
#[derive(Clone, Debug)]
pub struct Git {
    program: OsString,
}

impl Default for Git {
    fn default() -> Self {
        Self::new("git")
    }
}

impl Git {
    pub fn new(program: impl Into<OsString>) -> Self {
        Self {
            program: program.into(),
        }
    }

    fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", null_device())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_COMMITTER_NAME", XTASK_NAME)
            .env("GIT_COMMITTER_EMAIL", XTASK_EMAIL)
            .env("GIT_AUTHOR_NAME", XTASK_NAME)
            .env("GIT_AUTHOR_EMAIL", XTASK_EMAIL)
            .env("LC_ALL", "C")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .args(["-c", "core.autocrlf=false", "-c", "commit.gpgsign=false"]);
        cmd
    }

    /// Runs git and returns its output whatever the exit status; fails only when git cannot run.
    pub fn output<I, S>(&self, dir: &Path, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(dir);
        cmd.args(args);
        match cmd.output() {
            Ok(out) => Ok(out),
            Err(err) if err.kind() == io::ErrorKind::NotFound => bail!(
                "git is not installed or not on PATH (tried `{}`); install git and retry",
                self.program.to_string_lossy()
            ),
            Err(err) => Err(err).with_context(|| format!("cannot run git in {}", dir.display())),
        }
    }

    /// Runs git, failing with its stderr when it exits non-zero; returns stdout.
    pub fn run<I, S>(&self, dir: &Path, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.output(dir, &args)?;
        if !out.status.success() {
            bail!(
                "`git {}` failed in {}: {}",
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8(out.stdout).context("git printed non-UTF-8 output")
    }

    /// Fails early, with an actionable message, when git is missing.
    pub fn ensure_available(&self) -> Result<()> {
        self.run(Path::new("."), ["--version"]).map(drop)
    }

    /// `git status --porcelain`: empty when the work tree and index are clean.
    pub fn uncommitted(&self, repo: &Path) -> Result<String> {
        self.run(repo, ["status", "--porcelain", "--untracked-files=all"])
    }

    pub fn tree_of(&self, repo: &Path, rev: &str) -> Result<String> {
        Ok(self
            .run(repo, ["rev-parse", &format!("{rev}^{{tree}}")])?
            .trim()
            .to_owned())
    }

    /// Makes `dir` a repository whose single commit holds its current files, tagged `upstream`.
    pub fn init_base(&self, dir: &Path, message: &str) -> Result<()> {
        self.run(dir, ["init", "--quiet", "--initial-branch=main"])?;
        self.run(dir, ["add", "--all", "--force"])?;
        // A fixed date makes the base commit identical on every machine.
        let mut cmd = self.command(dir);
        cmd.env("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z")
            .args(["commit", "--quiet", "--no-verify", "-m", message]);
        let out = cmd.output().context("cannot run git commit")?;
        if !out.status.success() {
            bail!(
                "git commit of the upstream base failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.run(dir, ["tag", "upstream"])?;
        Ok(())
    }

    /// Applies one mailbox patch with `git am`. On failure the repository is left in the `am`
    /// state so the conflict can be inspected; the error carries git's explanation.
    pub fn am(&self, repo: &Path, patch: &Path) -> Result<()> {
        let out = self.output(
            repo,
            [
                OsStr::new("am"),
                OsStr::new("--quiet"),
                OsStr::new("--keep-cr"),
                OsStr::new("--whitespace=nowarn"),
                patch.as_os_str(),
            ],
        )?;
        if !out.status.success() {
            bail!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

fn null_device() -> &'static str {
    if cfg!(windows) {
        "NUL"
    } else {
        "/dev/null"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_git_is_named_with_a_fix() {
        let err = Git::new("/nonexistent/bin/git")
            .ensure_available()
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("git is not installed"), "{msg}");
        assert!(msg.contains("/nonexistent/bin/git"), "{msg}");
    }
}
