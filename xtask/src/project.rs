//! Where things live in the project, and the upstream release the series is pinned to.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The cargo that runs xtask (`$CARGO`), so nested builds use the same toolchain.
pub fn cargo_program() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// A command running [`cargo_program`] for a nested build, without the variables cargo set
/// for the xtask binary itself (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...). Some build
/// scripts (ring's) watch `CARGO_MANIFEST_DIR`; passing xtask's value on made every nested
/// build and every plain `cargo build` rebuild those crates and everything above them.
pub fn cargo_command() -> std::process::Command {
    let mut command = std::process::Command::new(cargo_program());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_xtask) {
            command.env_remove(name);
        }
    }
    command
}

fn set_by_cargo_for_xtask(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_BIN_NAME"
        )
}

/// The project's directories. Every command takes one, so tests can point it at a temporary copy.
#[derive(Clone, Debug)]
pub struct Project {
    root: PathBuf,
}

impl Project {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The project this xtask binary was built from (xtask lives one level below the root).
    pub fn from_build() -> Self {
        let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        Self::new(xtask_dir.parent().unwrap_or(xtask_dir))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The generated driver: pristine upstream plus the series, as a git repository.
    pub fn driver_dir(&self) -> PathBuf {
        self.root.join("driver")
    }

    pub fn patches_dir(&self) -> PathBuf {
        self.root.join("patches")
    }

    pub fn series_file(&self) -> PathBuf {
        self.patches_dir().join("series")
    }

    pub fn upstream_file(&self) -> PathBuf {
        self.patches_dir().join("UPSTREAM")
    }

    /// The specifications commit the spec suites come from when neither `SPEC_DIR` nor
    /// `spec-tests/data` is there (see `crate::spec_fetch`).
    pub fn spec_commit_file(&self) -> PathBuf {
        self.root.join("spec-tests").join("SPEC_COMMIT")
    }

    /// Fetched specifications commits, one directory each (ignored with the rest of `target/`).
    pub fn spec_cache_root(&self) -> PathBuf {
        self.root.join("target").join("spec-cache")
    }

    pub fn spec_cache_dir(&self, commit: &str) -> PathBuf {
        self.spec_cache_root().join(commit)
    }

    /// Scratch space for commands that keep results for inspection (rebase).
    pub fn scratch_dir(&self) -> PathBuf {
        self.root.join("target").join("xtask")
    }

    pub fn upstream(&self) -> Result<Upstream> {
        let path = self.upstream_file();
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        Upstream::parse(&text).with_context(|| format!("in {}", path.display()))
    }
}

/// The content of `patches/UPSTREAM`: which crate release the series applies to, and the SHA-256
/// that crates.io publishes for its `.crate` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub krate: String,
    pub version: String,
    /// Lower-case hex; `None` only for releases that are not pinned (`rebase` to a new version),
    /// which are then checked against the registry index's checksum alone.
    pub sha256: Option<String>,
}

impl Upstream {
    /// An unpinned release, as `rebase <version>` names one.
    pub fn unpinned(krate: &str, version: &str) -> Self {
        Self {
            krate: krate.to_owned(),
            version: version.to_owned(),
            sha256: None,
        }
    }

    /// Parses `key = value` lines; `#` starts a comment. Keys: `crate`, `version`, `sha256`, all
    /// required, each once.
    pub fn parse(text: &str) -> Result<Self> {
        let (mut krate, mut version, mut sha256) = (None, None, None);
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                bail!(
                    "line {}: expected `key = value`, found `{line}`",
                    number + 1
                );
            };
            let (key, value) = (key.trim(), value.trim().to_owned());
            let slot = match key {
                "crate" => &mut krate,
                "version" => &mut version,
                "sha256" => &mut sha256,
                other => bail!(
                    "line {}: unknown key `{other}` (expected crate, version, sha256)",
                    number + 1
                ),
            };
            if slot.replace(value).is_some() {
                bail!("line {}: `{key}` given twice", number + 1);
            }
        }
        let krate = krate.context("missing `crate = ...`")?;
        let version = version.context("missing `version = ...`")?;
        let sha256 = sha256
            .context("missing `sha256 = ...`")?
            .to_ascii_lowercase();
        if krate.is_empty()
            || !krate
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        {
            bail!("`crate = {krate}` is not a crate name");
        }
        if version.is_empty()
            || !version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
        {
            bail!("`version = {version}` is not an exact version");
        }
        if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
            bail!("`sha256` must be 64 hex digits, found `{sha256}`");
        }
        Ok(Self {
            krate,
            version,
            sha256: Some(sha256),
        })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.krate, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUM: &str = "af84443ae9878f59a6818686f339064479f42cdf293c4c637d8fc9c0a8c5eed6";

    #[test]
    fn nested_cargo_drops_only_the_variables_cargo_set_for_xtask() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_CRATE_NAME",
        ] {
            assert!(set_by_cargo_for_xtask(name), "{name}");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "RUSTFLAGS",
            "SPEC_DIR",
        ] {
            assert!(!set_by_cargo_for_xtask(name), "{name}");
        }
    }

    #[test]
    fn parses_pinned_release_with_comments() {
        let text = format!(
            "# pinned\ncrate = mongodb\nversion = 3.9.1  # exact\nsha256 = {}\n",
            SUM.to_uppercase()
        );
        let up = Upstream::parse(&text).unwrap();
        assert_eq!(up.krate, "mongodb");
        assert_eq!(up.version, "3.9.1");
        assert_eq!(up.sha256.as_deref(), Some(SUM));
    }

    #[test]
    fn rejects_missing_duplicate_unknown_and_malformed_fields() {
        let cases = [
            ("crate = mongodb\nversion = 3.9.1\n", "missing `sha256"),
            (
                &format!("crate = a\ncrate = b\nversion = 1\nsha256 = {SUM}"),
                "given twice",
            ),
            (
                &format!("crate = a\nversion = 1\nsha256 = {SUM}\nmirror = x"),
                "unknown key `mirror`",
            ),
            ("crate = a\nversion = 1\nsha256 = abc", "64 hex digits"),
            (
                &format!("crate = a\nversion = >=1\nsha256 = {SUM}"),
                "not an exact version",
            ),
            ("crate mongodb", "expected `key = value`"),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", Upstream::parse(text).unwrap_err());
            assert!(
                err.contains(expected),
                "`{text}` gave `{err}`, expected `{expected}`"
            );
        }
    }
}
