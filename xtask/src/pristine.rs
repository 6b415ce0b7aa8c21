//! Obtaining the pristine upstream crate through cargo, verifying it, and unpacking it.
//!
//! Upstream code enters the project only this way: cargo downloads the `.crate` archive that
//! crates.io serves, xtask checks its SHA-256 against the registry index and against
//! `patches/UPSTREAM`, then unpacks the archive itself (not cargo's unpacked copy in
//! `~/.cargo/registry/src`, which anything on the machine could have edited).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest, Sha256};

use crate::project::Upstream;

/// Where pristine `.crate` archives come from. Production asks cargo; tests use a local archive.
pub trait CrateSource {
    /// Returns the path of the release's `.crate` archive and, when known, the checksum the
    /// registry index publishes for it.
    fn fetch(&self, upstream: &Upstream) -> Result<Fetched>;
}

pub struct Fetched {
    pub archive: PathBuf,
    pub index_sha256: Option<String>,
}

/// Downloads through cargo: a throwaway manifest depends on `<crate> = "=<version>"`, `cargo
/// fetch` fills the local registry cache, `Cargo.lock` gives the index checksum.
pub struct CargoRegistry {
    cargo: OsString,
}

impl Default for CargoRegistry {
    fn default() -> Self {
        Self {
            cargo: crate::project::cargo_program(),
        }
    }
}

impl CrateSource for CargoRegistry {
    fn fetch(&self, upstream: &Upstream) -> Result<Fetched> {
        let dir = tempfile::Builder::new()
            .prefix("xtask-fetch-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let manifest = dir.path().join("Cargo.toml");
        fs::write(
            &manifest,
            format!(
                "[package]\nname = \"xtask-fetch-upstream\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
                 [lib]\npath = \"lib.rs\"\n[workspace]\n[dependencies]\n{} = \"={}\"\n",
                upstream.krate, upstream.version
            ),
        )?;
        fs::write(dir.path().join("lib.rs"), "")?;

        let out = Command::new(&self.cargo)
            .arg("fetch")
            .arg("--manifest-path")
            .arg(&manifest)
            .output()
            .with_context(|| format!("cannot run `{}`", self.cargo.to_string_lossy()))?;
        if !out.status.success() {
            bail!(
                "cargo could not download {upstream} from crates.io:\n{}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }

        let lock = fs::read_to_string(dir.path().join("Cargo.lock"))?;
        let index_sha256 = lock_checksum(&lock, &upstream.krate, &upstream.version)
            .with_context(|| format!("Cargo.lock names no checksum for {upstream}"))?;

        let out = Command::new(&self.cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--offline",
                "--manifest-path",
            ])
            .arg(&manifest)
            .output()
            .context("cannot run `cargo metadata`")?;
        if !out.status.success() {
            bail!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("cargo metadata printed invalid JSON")?;
        let manifest_path = meta["packages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["name"] == upstream.krate.as_str() && p["version"] == upstream.version.as_str()
            })
            .and_then(|p| p["manifest_path"].as_str())
            .with_context(|| format!("cargo metadata does not list {upstream}"))?;
        let archive = cached_archive(Path::new(manifest_path), upstream)?;
        Ok(Fetched {
            archive,
            index_sha256: Some(index_sha256),
        })
    }
}

/// Maps cargo's unpacked copy `<registry>/src/<index>/<name>-<version>/Cargo.toml` to the
/// archive it came from, `<registry>/cache/<index>/<name>-<version>.crate`.
fn cached_archive(manifest: &Path, upstream: &Upstream) -> Result<PathBuf> {
    let unpacked = manifest.parent().context("manifest path has no parent")?;
    let index_dir = unpacked.parent().context("unexpected registry layout")?;
    let registry = index_dir
        .parent()
        .and_then(Path::parent)
        .context("unexpected registry layout")?;
    let index_name = index_dir
        .file_name()
        .context("unexpected registry layout")?;
    let archive = registry
        .join("cache")
        .join(index_name)
        .join(format!("{}-{}.crate", upstream.krate, upstream.version));
    ensure!(
        archive.is_file(),
        "cargo fetched {upstream} but its archive is not at {}",
        archive.display()
    );
    Ok(archive)
}

/// Finds `checksum = "..."` of one package in a `Cargo.lock`.
fn lock_checksum(lock: &str, krate: &str, version: &str) -> Option<String> {
    let name_line = format!("name = \"{krate}\"");
    let version_line = format!("version = \"{version}\"");
    lock.split("[[package]]").find_map(|block| {
        let mut lines = block.lines().map(str::trim);
        let is_it = block.lines().any(|l| l.trim() == name_line)
            && block.lines().any(|l| l.trim() == version_line);
        if !is_it {
            return None;
        }
        lines.find_map(|l| {
            l.strip_prefix("checksum = \"")?
                .strip_suffix('"')
                .map(str::to_owned)
        })
    })
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Fetches the release, verifies its checksum against the index and `UPSTREAM`, and unpacks it
/// into `dest` (which must not exist yet).
pub fn unpack_verified(source: &dyn CrateSource, upstream: &Upstream, dest: &Path) -> Result<()> {
    let fetched = source.fetch(upstream)?;
    let actual = sha256_file(&fetched.archive)?;
    if let Some(index) = &fetched.index_sha256 {
        ensure!(
            index.eq_ignore_ascii_case(&actual),
            "checksum mismatch for {upstream}: the registry index publishes {index}, the \
             downloaded archive {} has {actual}",
            fetched.archive.display()
        );
    }
    if let Some(pinned) = &upstream.sha256 {
        ensure!(
            pinned.eq_ignore_ascii_case(&actual),
            "checksum mismatch for {upstream}: patches/UPSTREAM pins sha256 {pinned}, the \
             archive {} has {actual}; fix patches/UPSTREAM only if you meant to change the \
             upstream release",
            fetched.archive.display()
        );
    }
    unpack(&fetched.archive, upstream, dest)
}

/// Unpacks a `.crate` archive (gzip-compressed tar whose entries all live under
/// `<name>-<version>/`) into `dest`, refusing entries that would land anywhere else.
pub fn unpack(archive: &Path, upstream: &Upstream, dest: &Path) -> Result<()> {
    let prefix = format!("{}-{}", upstream.krate, upstream.version);
    fs::create_dir_all(dest)?;
    let file = File::open(archive).with_context(|| format!("cannot open {}", archive.display()))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut files = 0usize;
    for entry in tar.entries().context("not a .crate archive (gzip tar)")? {
        let mut entry = entry.context("corrupt .crate archive")?;
        let path = entry.path()?.into_owned();
        let relative = path.strip_prefix(&prefix).map_err(|_| {
            io::Error::other(format!(
                "archive entry {} is outside {prefix}/",
                path.display()
            ))
        })?;
        if relative.as_os_str().is_empty() {
            continue;
        }
        ensure!(
            relative
                .components()
                .all(|c| matches!(c, Component::Normal(_))),
            "archive entry {} escapes the package directory",
            path.display()
        );
        let target = dest.join(relative);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        entry
            .unpack(&target)
            .with_context(|| format!("cannot unpack {}", path.display()))?;
        files += 1;
    }
    ensure!(files > 0, "{} holds no files", archive.display());
    Ok(())
}

/// A directory of `.crate` archives named `<crate>-<version>.crate`, as cargo's cache keeps
/// them; used by tests and by anyone working offline with a mirror.
pub struct LocalMirror(pub PathBuf);

impl CrateSource for LocalMirror {
    fn fetch(&self, upstream: &Upstream) -> Result<Fetched> {
        let archive = self
            .0
            .join(format!("{}-{}.crate", upstream.krate, upstream.version));
        ensure!(
            archive.is_file(),
            "{upstream} is not in the mirror {}",
            self.0.display()
        );
        Ok(Fetched {
            archive,
            index_sha256: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_checksum_of_the_named_release_only() {
        let lock = r#"
[[package]]
name = "mongodb"
version = "3.9.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "00"

[[package]]
name = "mongodb"
version = "3.9.1"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "af84"
"#;
        assert_eq!(
            lock_checksum(lock, "mongodb", "3.9.1").as_deref(),
            Some("af84")
        );
        assert_eq!(lock_checksum(lock, "mongodb", "3.9.2"), None);
    }

    #[test]
    fn maps_unpacked_sources_to_the_cached_archive() {
        let home = tempfile::tempdir().unwrap();
        let cache = home.path().join("registry/cache/index.crates.io-1");
        fs::create_dir_all(&cache).unwrap();
        fs::write(cache.join("mongodb-3.9.1.crate"), b"x").unwrap();
        let manifest = home
            .path()
            .join("registry/src/index.crates.io-1/mongodb-3.9.1/Cargo.toml");
        let up = Upstream::unpinned("mongodb", "3.9.1");
        assert_eq!(
            cached_archive(&manifest, &up).unwrap(),
            cache.join("mongodb-3.9.1.crate")
        );
        let missing = Upstream::unpinned("mongodb", "3.9.2");
        assert!(cached_archive(&manifest, &missing).is_err());
    }
}
