//! The two scratch copies upstream's tests run in: pristine 3.9.1 and the fork (pristine plus
//! `patches/series`), each with upstream's `driver/src/test.rs`, `driver/src/test/**`, `spec/**`
//! and `.config/nextest.toml` laid over it, then the adaptation series
//! (`upstream-tests/adaptations/series`) applied.
//!
//! A copy is rebuilt only when what it is made of changed (a stamp file records the inputs), so
//! cargo finds the same files with the same timestamps and reuses its build.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest, Sha256};

use crate::fork::{base_message, remove_dir_if_exists, Workspace};
use crate::pristine;

/// Which driver a copy holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Pristine,
    Fork,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Pristine => "pristine",
            Variant::Fork => "fork",
        }
    }
}

/// The profile the command adds to the copy's nextest configuration; see [`labd_profile`].
pub const NEXTEST_PROFILE: &str = "labd";

/// The topologies that get a profile of their own (`run::Topology` names them the same).
pub const TOPOLOGIES: [&str; 3] = ["standalone", "replicaset", "sharded"];

/// The JUnit report of that profile, under `<target dir>/nextest/<profile>/`: one per copy, so
/// that the two copies can run at once.
pub fn junit_file(variant: Variant) -> String {
    format!("junit-{}.xml", variant.name())
}

/// Where upstream's tests are: a directory with `driver/src/test.rs`, `driver/src/test/`,
/// `spec/` and `.config/nextest.toml`.
pub fn check_tests_dir(dir: &Path) -> Result<()> {
    for needed in [
        "driver/src/test.rs",
        "driver/src/test",
        "spec",
        ".config/nextest.toml",
    ] {
        ensure!(
            dir.join(needed).exists(),
            "{} holds no {needed}: not a copy of upstream's test suite (see docs/upstream-tests.md)",
            dir.display()
        );
    }
    Ok(())
}

/// The adaptation patches of a copy, in order: `upstream-tests/adaptations/series` (both
/// copies), then for the fork `upstream-tests/adaptations-fork/series` (none when absent).
pub fn adaptations(project_root: &Path, variant: Variant) -> Result<Vec<PathBuf>> {
    let mut list = series_in(&project_root.join("upstream-tests").join("adaptations"))?;
    if variant == Variant::Fork {
        list.extend(series_in(
            &project_root.join("upstream-tests").join("adaptations-fork"),
        )?);
    }
    Ok(list)
}

fn series_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let series = dir.join("series");
    let text = match fs::read_to_string(&series) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", series.display())),
    };
    let mut list = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        ensure!(
            !line.contains('/') && line.ends_with(".patch"),
            "{}: `{line}` is not a patch file name in that directory",
            series.display()
        );
        let path = dir.join(line);
        ensure!(
            path.is_file(),
            "{} names {line}, which does not exist",
            series.display()
        );
        list.push(path);
    }
    Ok(list)
}

/// Makes `dest` (a directory holding `driver/` and `spec/`) the given copy, unless its stamp says
/// it already is. Returns the crate directory (`dest/driver`).
pub fn prepare_copy(
    ws: &Workspace,
    variant: Variant,
    tests_dir: &Path,
    tests_label: &str,
    dest: &Path,
) -> Result<PathBuf> {
    check_tests_dir(tests_dir)?;
    let project = &ws.project;
    let upstream = project.upstream()?;
    let adaptations = adaptations(project.root(), variant)?;
    let series = if variant == Variant::Fork {
        crate::series::read(project)?
    } else {
        Vec::new()
    };

    // What the copy is made of; any change rebuilds it.
    let mut hasher = Sha256::new();
    hasher.update(format!("{}\n{upstream}\n{tests_label}\n", variant.name()));
    for patch in &series {
        hasher.update(patch.text.as_bytes());
    }
    for path in &adaptations {
        hasher.update(fs::read(path)?);
    }
    let stamp_text: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let stamp = dest.join("STAMP");
    let krate = dest.join("driver");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text.as_str()) && krate.is_dir() {
        write_nextest_config(tests_dir, &krate, variant)?;
        return Ok(krate);
    }

    remove_dir_if_exists(dest)?;
    fs::create_dir_all(dest)?;
    pristine::unpack_verified(ws.source.as_ref(), &upstream, &krate)?;
    ws.git.init_base(&krate, &base_message(&upstream))?;
    for patch in &series {
        ws.git
            .am(&krate, &project.patches_dir().join(&patch.file))
            .with_context(|| format!("patch {} does not apply", patch.file))?;
    }
    if variant == Variant::Fork {
        let pristine_manifest = pristine_manifest(ws, &upstream)?;
        let manifest = krate.join("Cargo.toml");
        let text = fs::read_to_string(&manifest)?;
        let overload = project.root().join("overload");
        fs::write(
            &manifest,
            restore_tests_in_fork_manifest(&text, &pristine_manifest, &overload)?,
        )?;
    }
    // The copy is its own workspace: it lives inside the project's target/, under the project's
    // workspace manifest, which must not claim it.
    let manifest = krate.join("Cargo.toml");
    let mut text = fs::read_to_string(&manifest)?;
    text.push_str("\n# Added by `cargo xtask upstream-tests`: this copy is a workspace of its own.\n[workspace]\n");
    fs::write(&manifest, text)?;

    copy_tree(&tests_dir.join("driver/src/test"), &krate.join("src/test"))?;
    fs::copy(
        tests_dir.join("driver/src/test.rs"),
        krate.join("src/test.rs"),
    )?;
    copy_tree(&tests_dir.join("spec"), &dest.join("spec"))?;
    write_nextest_config(tests_dir, &krate, variant)?;
    // Commit the laid-over tests so each adaptation's effect is its own diff in the copy.
    ws.git.run(&krate, ["add", "--all", "--force"])?;
    ws.git.run(
        &krate,
        [
            "commit",
            "--quiet",
            "--no-verify",
            "-m",
            "upstream's tests laid over",
        ],
    )?;
    for path in &adaptations {
        ws.git.am(&krate, path).with_context(|| {
            format!(
                "adaptation {} does not apply to the {} copy",
                path.display(),
                variant.name()
            )
        })?;
    }
    fs::write(&stamp, stamp_text)?;
    Ok(krate)
}

/// Upstream's nextest configuration plus the command's profile. Written on every run (nextest
/// reads it at run time; it is no input of the build, so it is not part of the stamp).
fn write_nextest_config(tests_dir: &Path, krate: &Path, variant: Variant) -> Result<()> {
    let upstream_nextest = fs::read_to_string(tests_dir.join(".config/nextest.toml"))?;
    fs::create_dir_all(krate.join(".config"))?;
    fs::write(
        krate.join(".config/nextest.toml"),
        format!(
            "{upstream_nextest}\n{}",
            labd_profile(&upstream_nextest, variant)?
        ),
    )?;
    Ok(())
}

/// The pristine release's `Cargo.toml`, read from a fresh unpack.
fn pristine_manifest(ws: &Workspace, upstream: &crate::project::Upstream) -> Result<String> {
    let scratch = tempfile::tempdir()?;
    let dir = scratch.path().join("crate");
    pristine::unpack_verified(ws.source.as_ref(), upstream, &dir)?;
    Ok(fs::read_to_string(dir.join("Cargo.toml"))?)
}

/// The fork's manifest turns the library's unit tests off and drops upstream's dev-dependencies
/// (the published crate lacks the test tree they serve). For upstream's tests the copy needs
/// both back, and the fork's `overload` path dependency must point at the project's crate.
pub fn restore_tests_in_fork_manifest(
    fork: &str,
    pristine: &str,
    overload_dir: &Path,
) -> Result<String> {
    let mut out = String::with_capacity(fork.len() + 4096);
    let mut in_lib = false;
    for line in fork.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            in_lib = trimmed == "[lib]";
        }
        if in_lib && (trimmed == "test = false" || trimmed == "doctest = false") {
            continue;
        }
        if trimmed == "path = \"../overload\"" {
            out.push_str(&format!(
                "path = {:?}\n",
                overload_dir.display().to_string()
            ));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    ensure!(
        !out.contains("[dev-dependencies"),
        "the fork's Cargo.toml already has dev-dependencies; the copy's manifest rewrite \
         (xtask/src/upstream_tests/prepare.rs) needs updating"
    );
    let dev = dev_dependency_sections(pristine);
    ensure!(
        !dev.is_empty(),
        "pristine Cargo.toml has no [dev-dependencies.*] sections"
    );
    out.push_str("\n# Restored from the pristine manifest by `cargo xtask upstream-tests`.\n");
    out.push_str(&dev);
    Ok(out)
}

/// Every `[dev-dependencies.*]` section of a normalized (published) manifest, verbatim.
fn dev_dependency_sections(manifest: &str) -> String {
    let mut out = String::new();
    let mut keep = false;
    for line in manifest.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            keep = trimmed.starts_with("[dev-dependencies");
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The profile the command runs: upstream's default filter (its `skip_local` and `skip_ci`
/// exclusions) and its one test thread, plus a deadline per test so a test waiting on something
/// labd never sends ends as a failure instead of stopping the run.
pub fn labd_profile(upstream_nextest: &str, variant: Variant) -> Result<String> {
    let junit = junit_file(variant);
    let mut in_default = false;
    let mut filter = None;
    for line in upstream_nextest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_default = line == "[profile.default]";
            continue;
        }
        if in_default {
            if let Some(value) = line.strip_prefix("default-filter") {
                let value = value.trim_start().strip_prefix('=').map(str::trim);
                filter = value.map(str::to_owned);
            }
        }
    }
    let Some(filter) = filter else {
        bail!("upstream's .config/nextest.toml has no default-filter in [profile.default]");
    };
    let mut text = String::from(
        "# Added by `cargo xtask upstream-tests`: upstream's default filter and thread count, no\n\
         # fail-fast, and a deadline per test (2 x 60 s) so a hang is a failure, not a stalled run.\n\
         # One profile per topology, each with its own JUnit report, so runs can go at once.\n",
    );
    for name in
        std::iter::once(NEXTEST_PROFILE.to_owned()).chain(TOPOLOGIES.iter().map(|t| profile_for(t)))
    {
        text.push_str(&profile_body(&name, &filter, &junit));
    }
    Ok(text)
}

/// The nextest profile of a run in `topology` (its JUnit report is its own).
pub fn profile_for(topology: &str) -> String {
    format!("{NEXTEST_PROFILE}-{topology}")
}

fn profile_body(name: &str, filter: &str, junit: &str) -> String {
    format!(
        "[profile.{name}]\n\
         default-filter = {filter}\n\
         test-threads = 1\n\
         fail-fast = false\n\
         slow-timeout = {{ period = \"60s\", terminate-after = 2 }}\n\
         # Every test's output, passing ones too: a test that only printed why it skipped is\n\
         # counted as skipped, not passed.\n\
         [profile.{name}.junit]\n\
         path = \"{junit}\"\n\
         store-success-output = true\n\
         store-failure-output = true\n"
    )
}

/// Copies a directory tree (files and directories only), making every copy writable.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &target)
                .with_context(|| format!("cannot copy {}", entry.path().display()))?;
            let mut perms = fs::metadata(&target)?.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            perms.set_readonly(false);
            fs::set_permissions(&target, perms)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_keeps_upstreams_filter_and_adds_a_deadline() {
        let upstream = "[profile.default]\ntest-threads = 1\ndefault-filter = 'not test(skip_local) and not test(skip_ci)'\n\n[profile.ci]\ndefault-filter = 'not test(skip_ci)'\n";
        let profile = labd_profile(upstream, Variant::Fork).unwrap();
        assert!(
            profile.contains("default-filter = 'not test(skip_local) and not test(skip_ci)'\n"),
            "{profile}"
        );
        assert!(profile.contains("terminate-after = 2"));
        assert!(profile.contains("path = \"junit-fork.xml\""), "{profile}");
        assert!(labd_profile("[profile.ci]\ndefault-filter = 'x'\n", Variant::Fork).is_err());
    }

    #[test]
    fn the_fork_manifest_gets_tests_and_dev_dependencies_back() {
        let fork = "[package]\nname = \"mongodb\"\n\n[lib]\nname = \"mongodb\"\ntest = false\ndoctest = false\n\n[dependencies.overload]\npath = \"../overload\"\nversion = \"0.1.0\"\n";
        let pristine = "[lib]\nname = \"mongodb\"\n\n[dev-dependencies.semver]\nversion = \"1.0.0\"\n\n[dev-dependencies.tokio]\nfeatures = [\"fs\"]\n\n[target.\"cfg(x)\".dependencies.a]\nversion = \"1\"\n";
        let out = restore_tests_in_fork_manifest(fork, pristine, Path::new("/p/overload")).unwrap();
        assert!(
            !out.contains("test = false") && !out.contains("doctest = false"),
            "{out}"
        );
        assert!(out.contains("path = \"/p/overload\"\n"), "{out}");
        assert!(
            out.contains("[dev-dependencies.semver]\nversion = \"1.0.0\"\n"),
            "{out}"
        );
        assert!(
            out.contains("[dev-dependencies.tokio]\nfeatures = [\"fs\"]\n"),
            "{out}"
        );
        assert!(!out.contains("cfg(x)"), "{out}");
        let twice = restore_tests_in_fork_manifest(&out, pristine, Path::new("/p/overload"));
        assert!(twice.is_err());
    }

    #[test]
    fn adaptations_come_from_the_series_in_order() {
        let root = tempfile::tempdir().unwrap();
        assert!(adaptations(root.path(), Variant::Pristine)
            .unwrap()
            .is_empty());
        let dir = root.path().join("upstream-tests/adaptations");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("0002-b.patch"), "").unwrap();
        fs::write(dir.join("0001-a.patch"), "").unwrap();
        fs::write(
            dir.join("series"),
            "# comment\n0002-b.patch\n\n0001-a.patch\n",
        )
        .unwrap();
        let list = adaptations(root.path(), Variant::Pristine).unwrap();
        assert_eq!(
            list,
            vec![dir.join("0002-b.patch"), dir.join("0001-a.patch")]
        );
        let fork_dir = root.path().join("upstream-tests/adaptations-fork");
        fs::create_dir_all(&fork_dir).unwrap();
        fs::write(fork_dir.join("0001-f.patch"), "").unwrap();
        fs::write(fork_dir.join("series"), "0001-f.patch\n").unwrap();
        assert_eq!(adaptations(root.path(), Variant::Pristine).unwrap(), list);
        let fork = adaptations(root.path(), Variant::Fork).unwrap();
        assert_eq!(fork.last(), Some(&fork_dir.join("0001-f.patch")));
        assert_eq!(fork.len(), 3);
        fs::write(dir.join("series"), "0003-missing.patch\n").unwrap();
        assert!(adaptations(root.path(), Variant::Pristine).is_err());
        fs::write(dir.join("series"), "../escape.patch\n").unwrap();
        assert!(adaptations(root.path(), Variant::Pristine).is_err());
    }
}
