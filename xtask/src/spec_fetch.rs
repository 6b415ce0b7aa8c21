//! The specifications' test JSON for a machine that has neither `SPEC_DIR` nor `spec-tests/data`:
//! a shallow git fetch of the public specifications repository at the commit pinned in
//! `spec-tests/SPEC_COMMIT`, kept in `target/spec-cache/<commit>` and reused without network
//! on later runs.
//!
//! The fetch goes to a staging directory and is renamed into place only after the checked-out
//! commit has been compared with the pin, so a cache directory named after a commit always holds
//! that commit (the spec runner relies on this when it falls back to the cache by itself).

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

use crate::fork::remove_dir_if_exists;
use crate::project::Project;

/// The public repository the pinned commit comes from.
pub const DEFAULT_REPO_URL: &str = "https://github.com/mongodb/specifications.git";

/// Overrides [`DEFAULT_REPO_URL`] (a mirror, or a local stand-in in tests).
pub const REPO_URL_VAR: &str = "SPEC_REPO_URL";

/// Reads the pin: the one line of `spec-tests/SPEC_COMMIT` that is not blank or a `#` comment,
/// a full commit id as git prints it, 40 lower-case hex digits (git fetches a commit by id only
/// when it is complete; the spec runner looks for the cache under the same spelling).
pub fn read_pin(project: &Project) -> Result<String> {
    let path = project.spec_commit_file();
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_pin(&text).with_context(|| format!("in {}", path.display()))
}

pub fn parse_pin(text: &str) -> Result<String> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'));
    let Some(commit) = lines.next() else {
        bail!("no commit id (expected one line of 40 hex digits)");
    };
    if let Some(extra) = lines.next() {
        bail!("more than one commit id: `{commit}` and `{extra}`");
    }
    if commit.len() != 40 || !commit.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) {
        bail!("`{commit}` is not a full commit id (40 lower-case hex digits)");
    }
    Ok(commit.to_owned())
}

/// A git executable run with the user's own configuration (proxies, `url.*.insteadOf`), unlike
/// [`crate::git::Git`], which ignores it to keep exported patches identical everywhere: a fetch
/// should reach the network the way the user's other git commands do.
#[derive(Clone, Debug)]
pub struct Fetcher {
    pub git: PathBuf,
    pub url: String,
}

impl Fetcher {
    /// `git` from PATH, and the repository from `SPEC_REPO_URL` or else the public one.
    pub fn from_env() -> Self {
        Self {
            git: PathBuf::from("git"),
            url: std::env::var(REPO_URL_VAR)
                .ok()
                .filter(|url| !url.is_empty())
                .unwrap_or_else(|| DEFAULT_REPO_URL.to_owned()),
        }
    }

    fn output<I, S>(&self, dir: &Path, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(&self.git);
        command
            .current_dir(dir)
            // Never wait for a password: an unreachable or private URL must fail, not prompt.
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("LC_ALL", "C")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .args(["-c", "advice.detachedHead=false"])
            // A connection that stalls below 1 KB/s for 60 s is abandoned rather than waited on.
            .args([
                "-c",
                "http.lowSpeedLimit=1024",
                "-c",
                "http.lowSpeedTime=60",
            ])
            .args(args);
        match command.output() {
            Ok(out) => Ok(out),
            Err(err) if err.kind() == io::ErrorKind::NotFound => bail!(
                "git is not installed or not on PATH (tried `{}`); install git and retry",
                self.git.display()
            ),
            Err(err) => Err(err).with_context(|| format!("cannot run git in {}", dir.display())),
        }
    }

    /// Runs git; on a non-zero exit, fails with the reason git gave (see [`git_reason`]).
    fn run<I, S>(&self, dir: &Path, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self.output(dir, args)?;
        if !out.status.success() {
            bail!("{}", git_reason(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// The checked-out commit of `dir`, if it is the top of a git work tree with one. (Without
    /// its own `.git`, git would answer for an enclosing repository: the project's own.)
    fn head(&self, dir: &Path) -> Option<String> {
        if !dir.join(".git").is_dir() {
            return None;
        }
        self.run(dir, ["rev-parse", "--verify", "HEAD"]).ok()
    }

    /// The directory holding `source/` at `commit`: the cache when it already holds that commit
    /// (no network), else a fresh shallow fetch into it. `fetched` tells which.
    pub fn ensure(&self, project: &Project, commit: &str) -> Result<CachedSpec> {
        let dir = project.spec_cache_dir(commit);
        if dir.join("source").is_dir() && self.head(&dir).as_deref() == Some(commit) {
            return Ok(CachedSpec {
                dir,
                fetched: false,
            });
        }
        let parent = project.spec_cache_root();
        fs::create_dir_all(&parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        // One staging directory per process: two runs fetching at once do not share one.
        let staging = parent.join(format!("{commit}.partial-{}", std::process::id()));
        remove_dir_if_exists(&staging)?;
        fs::create_dir_all(&staging)
            .with_context(|| format!("cannot create {}", staging.display()))?;
        let verified = self.fetch_into(&staging, commit).and_then(|()| {
            let head = self.head(&staging).unwrap_or_default();
            if head != commit {
                bail!("checked out `{head}`, not the pinned commit {commit}");
            }
            Ok(())
        });
        if let Err(reason) = verified {
            // Best effort: the staging directory only wastes space if it stays.
            let _ = remove_dir_if_exists(&staging);
            bail!(
                "cannot fetch the specifications repository at commit {commit} (pinned in \
                 spec-tests/SPEC_COMMIT) from {url}: {reason:#}. Without network access, set \
                 SPEC_DIR to a checkout of that repository, or copy its suites once with \
                 `cargo xtask sync-spec <checkout>`.",
                url = self.url,
            );
        }
        // A stale or broken cache (wrong commit, no `source/`) gives way to the verified fetch.
        remove_dir_if_exists(&dir)?;
        if let Err(err) = fs::rename(&staging, &dir) {
            let _ = remove_dir_if_exists(&staging);
            // Another run may have put the same verified commit in place first.
            if !(dir.join("source").is_dir() && self.head(&dir).as_deref() == Some(commit)) {
                return Err(err)
                    .with_context(|| format!("cannot move the fetch to {}", dir.display()));
            }
        }
        Ok(CachedSpec { dir, fetched: true })
    }

    /// `git init`, `source/` only in the work tree, a depth-1 fetch of exactly `commit`, and a
    /// detached checkout of it.
    fn fetch_into(&self, dir: &Path, commit: &str) -> Result<()> {
        self.run(dir, ["init", "--quiet"])?;
        // The suites live under `source/`; the rest of the repository is prose and tooling.
        self.run(dir, ["sparse-checkout", "set", "source"])?;
        self.run(
            dir,
            [
                "fetch",
                "--quiet",
                "--depth",
                "1",
                "--no-tags",
                &self.url,
                commit,
            ],
        )?;
        self.run(dir, ["checkout", "--quiet", "--detach", "FETCH_HEAD"])?;
        if !dir.join("source").is_dir() {
            bail!("commit {commit} has no `source/` directory");
        }
        Ok(())
    }
}

/// Where the pinned specifications are, and whether this run fetched them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedSpec {
    pub dir: PathBuf,
    pub fetched: bool,
}

/// Why git failed, from its stderr: the first `fatal:` line (later ones tend to be generic,
/// like "the remote end hung up"), else the last line.
fn git_reason(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .find(|line| line.starts_with("fatal:"))
        .map(|line| line.trim_start_matches("fatal:").trim_start())
        .or_else(|| text.lines().rev().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("git failed without a message")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "92b3c0b9287bfba1b0ec4084300858d05c654f8c";

    #[test]
    fn pin_is_one_full_commit_id_among_comments() {
        let text = format!("# the specifications commit\n\n  {SHA}  \n");
        assert_eq!(parse_pin(&text).unwrap(), SHA);
        for (text, expected) in [
            (SHA.to_uppercase().as_str(), "not a full commit id"),
            ("# nothing\n", "no commit id"),
            ("92b3c0b", "not a full commit id"),
            (format!("{SHA}\n{SHA}\n").as_str(), "more than one"),
            (format!("{}g", &SHA[..39]).as_str(), "not a full commit id"),
        ] {
            let err = parse_pin(text).unwrap_err().to_string();
            assert!(err.contains(expected), "`{text}` gave `{err}`");
        }
    }

    #[test]
    fn git_failures_report_the_fatal_line() {
        let stderr =
            b"fatal: remote error: upload-pack: not our ref 0123\nfatal: the remote end hung up\n";
        assert_eq!(
            git_reason(stderr),
            "remote error: upload-pack: not our ref 0123"
        );
        assert_eq!(git_reason(b"warning: a\nerror: b\n"), "error: b");
        assert_eq!(git_reason(b""), "git failed without a message");
    }

    #[test]
    fn the_project_pins_a_commit() {
        let pin = read_pin(&Project::from_build()).unwrap();
        assert_eq!(pin.len(), 40);
    }
}
