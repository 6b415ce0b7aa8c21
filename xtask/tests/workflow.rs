//! The fork workflow end to end, against a temporary project and a fake upstream crate served
//! from a local mirror (no network).

use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;
use xtask::fork::{DriverOutcome, Workspace};
use xtask::git::Git;
use xtask::pristine::{sha256_file, LocalMirror};
use xtask::project::Project;
use xtask::rebase::PatchFate;

const GOOD_MESSAGE_TAIL: &str = "\n\nThe fake crate needs a second function so the workflow has a \
change to carry; it stands in for a real fix.\n\nOrigin: vendor\nForwarded: not-needed\n\
Last-Update: 2026-11-29\n";

struct Fixture {
    _dir: TempDir,
    root: PathBuf,
    mirror: PathBuf,
}

impl Fixture {
    /// A project pinned to fake `mongodb 9.9.9`, with an empty series.
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let mirror = dir.path().join("mirror");
        fs::create_dir_all(root.join("patches")).unwrap();
        fs::create_dir_all(&mirror).unwrap();
        let fixture = Self {
            _dir: dir,
            root,
            mirror,
        };
        let archive = fixture.publish("9.9.9", "pub fn upstream() -> u32 {\n    1\n}\n");
        fixture.pin("9.9.9", &sha256_file(&archive).unwrap());
        fs::write(fixture.root.join("patches/series"), "").unwrap();
        fixture
    }

    /// Writes `mongodb-<version>.crate` into the mirror, as crates.io packages a crate.
    fn publish(&self, version: &str, lib_rs: &str) -> PathBuf {
        let path = self.mirror.join(format!("mongodb-{version}.crate"));
        let file = fs::File::create(&path).unwrap();
        let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::default(),
        ));
        let manifest = format!("[package]\nname = \"mongodb\"\nversion = \"{version}\"\n");
        for (name, body) in [("Cargo.toml", manifest.as_str()), ("src/lib.rs", lib_rs)] {
            let mut header = tar::Header::new_gnu();
            header.set_size(body.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(
                &mut header,
                format!("mongodb-{version}/{name}"),
                body.as_bytes(),
            )
            .unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
        path
    }

    fn pin(&self, version: &str, sha256: &str) {
        fs::write(
            self.root.join("patches/UPSTREAM"),
            format!("crate = mongodb\nversion = {version}\nsha256 = {sha256}\n"),
        )
        .unwrap();
    }

    fn workspace(&self) -> Workspace {
        Workspace {
            project: Project::new(&self.root),
            git: Git::default(),
            source: Box::new(LocalMirror(self.mirror.clone())),
        }
    }

    fn driver(&self) -> PathBuf {
        self.root.join("driver")
    }

    /// Commits a change inside driver/, as a developer does.
    fn commit_in_driver(&self, file: &str, content: &str, message: &str) {
        let path = self.driver().join(file);
        fs::write(&path, content).unwrap();
        let git = Git::default();
        git.run(&self.driver(), ["add", "--all"]).unwrap();
        git.run(&self.driver(), ["commit", "--quiet", "-m", message])
            .unwrap();
    }

    /// Commits the same small, well-described change most tests need.
    fn commit_fork_function(&self) {
        self.commit_in_driver(
            "src/extra.rs",
            "pub fn fork() {}\n",
            &format!("Add a fork function{GOOD_MESSAGE_TAIL}"),
        );
    }

    fn patch_files(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.root.join("patches"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        names.sort();
        names
    }
}

fn log_upstream_to_head(driver: &Path) -> Vec<String> {
    Git::default()
        .run(driver, ["log", "--format=%s", "upstream.."])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn error_of<T: std::fmt::Debug>(result: anyhow::Result<T>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn driver_builds_pristine_base_and_then_does_nothing() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    assert_eq!(
        ws.build_driver(false).unwrap(),
        DriverOutcome::Built { patches: 0 }
    );
    assert_eq!(
        fs::read_to_string(fx.driver().join("src/lib.rs")).unwrap(),
        "pub fn upstream() -> u32 {\n    1\n}\n"
    );
    assert!(log_upstream_to_head(&fx.driver()).is_empty());
    assert_eq!(ws.build_driver(false).unwrap(), DriverOutcome::UpToDate);
    ws.check().unwrap();
}

#[test]
fn commit_then_export_changes_patches_and_check_passes() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();
    fx.commit_fork_function();

    let report = ws.export().unwrap();
    assert_eq!(
        report,
        ["added add-a-fork-function.patch", "changed series"]
    );
    assert_eq!(fx.patch_files(), ["add-a-fork-function.patch"]);
    assert!(fs::read_to_string(fx.root.join("patches/series"))
        .unwrap()
        .contains("\nadd-a-fork-function.patch\n"));
    let patch = fs::read_to_string(fx.root.join("patches/add-a-fork-function.patch")).unwrap();
    assert!(
        patch.starts_with("From 0000000000000000000000000000000000000000 "),
        "{patch}"
    );
    assert!(!patch.contains("\n-- \n"), "no tool signature: {patch}");
    ws.check().unwrap();
    assert!(
        ws.export().unwrap().is_empty(),
        "a second export changes nothing"
    );

    // A fresh build from patches/ gives the same series.
    ws.build_driver(true).unwrap();
    assert_eq!(log_upstream_to_head(&fx.driver()), ["Add a fork function"]);
    assert_eq!(ws.build_driver(false).unwrap(), DriverOutcome::UpToDate);
}

#[test]
fn hand_edited_patch_fails_check_naming_it() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();
    fx.commit_fork_function();
    ws.export().unwrap();

    let path = fx.root.join("patches/add-a-fork-function.patch");
    let edited = fs::read_to_string(&path)
        .unwrap()
        .replace("pub fn fork() {}", "pub fn fork() { todo!() }");
    fs::write(&path, edited).unwrap();
    let err = error_of(ws.check());
    assert!(
        err.contains("patches/add-a-fork-function.patch differs"),
        "{err}"
    );
}

#[test]
fn patch_without_fields_fails_check_and_export() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();
    fx.commit_in_driver("src/extra.rs", "pub fn fork() {}\n", "Add a fork function");
    let err = error_of(ws.export());
    assert!(err.contains("patches/ is unchanged"), "{err}");
    assert!(err.contains("does not end with DEP-3 fields"), "{err}");
    assert!(fx.patch_files().is_empty());
    let err = error_of(ws.check());
    assert!(
        err.contains("commit `Add a fork function` is not exported"),
        "{err}"
    );
}

#[test]
fn driver_refuses_to_destroy_unexported_work() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();

    fx.commit_fork_function();
    let err = error_of(ws.build_driver(false));
    assert!(
        err.contains("commits that patches/ does not have") && err.contains("Add a fork function"),
        "{err}"
    );
    assert!(
        fx.driver().join("src/extra.rs").exists(),
        "the commit survives the refusal"
    );

    fs::write(fx.driver().join("src/lib.rs"), "// work in progress\n").unwrap();
    let err = error_of(ws.build_driver(false));
    assert!(
        err.contains("uncommitted changes") && err.contains("src/lib.rs"),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(fx.driver().join("src/lib.rs")).unwrap(),
        "// work in progress\n"
    );
    let err = error_of(ws.check());
    assert!(err.contains("uncommitted changes"), "{err}");

    // --force discards it, by explicit request.
    assert_eq!(
        ws.build_driver(true).unwrap(),
        DriverOutcome::Built { patches: 0 }
    );
    assert!(!fx.driver().join("src/extra.rs").exists());
}

#[test]
fn patch_that_no_longer_applies_is_named_and_left_for_inspection() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();
    fx.commit_in_driver(
        "src/lib.rs",
        "pub fn upstream() -> u32 {\n    2\n}\n",
        &format!("Return two{GOOD_MESSAGE_TAIL}"),
    );
    ws.export().unwrap();

    // Upstream "changes" under the series: pin a new archive whose lib.rs differs.
    let archive = fx.publish("9.9.9", "pub fn upstream() -> u64 {\n    7\n}\n");
    fx.pin("9.9.9", &sha256_file(&archive).unwrap());
    let err = error_of(ws.build_driver(false));
    assert!(
        err.contains("patch return-two.patch does not apply"),
        "{err}"
    );
    assert!(
        fx.driver().join(".git/rebase-apply").exists(),
        "git am state kept for inspection"
    );
    let err = error_of(ws.check());
    assert!(
        err.contains("patches/return-two.patch does not apply"),
        "{err}"
    );
}

#[test]
fn checksum_mismatch_is_refused() {
    let fx = Fixture::new();
    fx.pin("9.9.9", &"0".repeat(64));
    let err = error_of(fx.workspace().build_driver(false));
    assert!(
        err.contains("checksum mismatch for mongodb 9.9.9")
            && err.contains("patches/UPSTREAM pins"),
        "{err}"
    );
    assert!(
        !fx.driver().exists(),
        "nothing is built from an unverified archive"
    );
}

#[test]
fn missing_git_is_reported() {
    let fx = Fixture::new();
    let mut ws = fx.workspace();
    ws.git = Git::new("/nonexistent/git");
    let err = error_of(ws.build_driver(false));
    assert!(err.contains("git is not installed"), "{err}");
}

#[test]
fn rebase_reports_each_patch() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();
    fx.commit_fork_function();
    fx.commit_in_driver(
        "src/lib.rs",
        "pub fn upstream() -> u32 {\n    2\n}\n",
        &format!("Return two{GOOD_MESSAGE_TAIL}"),
    );
    ws.export().unwrap();
    fx.publish("9.10.0", "pub fn upstream() -> u64 {\n    7\n}\n");

    let report = ws.rebase("9.10.0").unwrap();
    assert_eq!(report.results.len(), 2);
    assert_eq!(
        report.results[0],
        ("add-a-fork-function.patch".to_owned(), PatchFate::Applied)
    );
    assert_eq!(
        report.results[1],
        (
            "return-two.patch".to_owned(),
            PatchFate::Conflicting(vec!["src/lib.rs".to_owned()])
        )
    );
    assert_eq!(report.conflicts(), 1);
    assert!(
        report.repo.join("src/extra.rs").exists(),
        "applied patches stay in the trial repository"
    );
}

#[test]
fn driver_follows_a_series_changed_by_a_pull() {
    let fx = Fixture::new();
    let ws = fx.workspace();
    ws.build_driver(false).unwrap();
    fx.commit_fork_function();
    ws.export().unwrap();

    // Another developer's export, arriving with a pull: a different series.
    let theirs = Fixture::new();
    let their_ws = theirs.workspace();
    their_ws.build_driver(false).unwrap();
    theirs.commit_in_driver(
        "src/lib.rs",
        "pub fn upstream() -> u32 {\n    2\n}\n",
        &format!("Return two{GOOD_MESSAGE_TAIL}"),
    );
    their_ws.export().unwrap();
    for name in fx.patch_files() {
        fs::remove_file(fx.root.join("patches").join(name)).unwrap();
    }
    for name in ["series", "return-two.patch"] {
        fs::copy(
            theirs.root.join("patches").join(name),
            fx.root.join("patches").join(name),
        )
        .unwrap();
    }

    // driver/ holds only what the old series made, so it is rebuilt without --force.
    assert_eq!(
        ws.build_driver(false).unwrap(),
        DriverOutcome::Built { patches: 1 }
    );
    assert_eq!(log_upstream_to_head(&fx.driver()), ["Return two"]);
    ws.check().unwrap();

    // New local work on top is still protected.
    fx.commit_fork_function();
    let err = error_of(ws.build_driver(false));
    assert!(err.contains("commits that patches/ does not have"), "{err}");
}
