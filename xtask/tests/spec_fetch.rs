//! Fetching the pinned specifications commit, against a local git repository standing in for
//! the public one (a `file://` URL; no network).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;
use xtask::project::Project;
use xtask::spec_fetch::{CachedSpec, Fetcher};
use xtask::testrun::{resolve_spec_dir, SpecOrigin};

/// A project directory with `spec-tests/SPEC_COMMIT`, and a stand-in specifications repository
/// with two commits: the pinned one, and a later one that changes a suite.
struct Fixture {
    dir: TempDir,
    pinned: String,
    later: String,
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=spec stand-in",
            "-c",
            "user.email=stand-in@invalid",
        ])
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let upstream = dir.path().join("specifications");
        fs::create_dir_all(&upstream).unwrap();
        git(&upstream, &["init", "--quiet"]);
        // GitHub serves any reachable commit by id; a local repository must be told to.
        git(
            &upstream,
            &["config", "uploadpack.allowReachableSHA1InWant", "true"],
        );
        git(
            &upstream,
            &["config", "uploadpack.allowAnySHA1InWant", "true"],
        );
        write(
            &upstream.join("source/retryable-reads/tests/unified/find.json"),
            "{\"pinned\": true}",
        );
        write(&upstream.join("scripts/generate.py"), "# not test data\n");
        git(&upstream, &["add", "--all"]);
        git(&upstream, &["commit", "--quiet", "-m", "pinned"]);
        let pinned = git(&upstream, &["rev-parse", "HEAD"]);
        write(
            &upstream.join("source/retryable-reads/tests/unified/find.json"),
            "{\"pinned\": false}",
        );
        git(&upstream, &["commit", "--quiet", "--all", "-m", "later"]);
        let later = git(&upstream, &["rev-parse", "HEAD"]);

        let fixture = Self { dir, pinned, later };
        fixture.pin(&fixture.pinned.clone());
        fixture
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    fn project(&self) -> Project {
        Project::new(self.root())
    }

    fn pin(&self, commit: &str) {
        write(
            &self.root().join("spec-tests/SPEC_COMMIT"),
            &format!("# stand-in pin\n{commit}\n"),
        );
    }

    fn fetcher(&self) -> Fetcher {
        Fetcher {
            git: "git".into(),
            url: format!(
                "file://{}",
                self.dir.path().join("specifications").display()
            ),
        }
    }

    /// A fetcher whose repository does not exist: what an offline machine sees.
    fn unreachable(&self) -> Fetcher {
        Fetcher {
            git: "git".into(),
            url: format!("file://{}", self.dir.path().join("absent").display()),
        }
    }

    fn cache_entries(&self) -> Vec<String> {
        match fs::read_dir(self.project().spec_cache_root()) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn suite_file(dir: &Path) -> String {
    fs::read_to_string(dir.join("source/retryable-reads/tests/unified/find.json")).unwrap()
}

#[test]
fn fetches_the_pinned_commit_then_reuses_the_cache_offline() {
    let fixture = Fixture::new();
    let project = fixture.project();

    let first = resolve_spec_dir(&project, None, &fixture.fetcher()).unwrap();
    assert_eq!(
        first.origin,
        SpecOrigin::Pinned {
            commit: fixture.pinned.clone(),
            fetched: true
        }
    );
    assert_eq!(first.dir, project.spec_cache_dir(&fixture.pinned));
    // The pinned commit, not the repository's newest one.
    assert_eq!(suite_file(&first.dir), "{\"pinned\": true}");
    // Only `source/` is checked out.
    assert!(!first.dir.join("scripts").exists());
    assert_eq!(fixture.cache_entries(), vec![fixture.pinned.clone()]);

    let again = resolve_spec_dir(&project, None, &fixture.unreachable()).unwrap();
    assert_eq!(
        again.origin,
        SpecOrigin::Pinned {
            commit: fixture.pinned.clone(),
            fetched: false
        }
    );
    assert_eq!(again.dir, first.dir);
}

#[test]
fn a_new_pin_fetches_its_own_commit_beside_the_old() {
    let fixture = Fixture::new();
    let project = fixture.project();
    let fetcher = fixture.fetcher();
    fetcher.ensure(&project, &fixture.pinned).unwrap();

    fixture.pin(&fixture.later);
    let found = resolve_spec_dir(&project, None, &fetcher).unwrap();
    assert_eq!(found.dir, project.spec_cache_dir(&fixture.later));
    assert_eq!(suite_file(&found.dir), "{\"pinned\": false}");
    let mut entries = fixture.cache_entries();
    entries.sort();
    let mut expected = vec![fixture.pinned.clone(), fixture.later.clone()];
    expected.sort();
    assert_eq!(entries, expected);
}

#[test]
fn a_cache_that_does_not_hold_the_pinned_commit_is_fetched_again() {
    let fixture = Fixture::new();
    let project = fixture.project();
    // Left by an interrupted copy, or edited by hand: `source/` but no commit to show for it.
    let dir = project.spec_cache_dir(&fixture.pinned);
    write(
        &dir.join("source/retryable-reads/tests/unified/find.json"),
        "{\"tampered\": true}",
    );

    let found = fixture.fetcher().ensure(&project, &fixture.pinned).unwrap();
    assert_eq!(
        found,
        CachedSpec {
            dir: dir.clone(),
            fetched: true
        }
    );
    assert_eq!(suite_file(&dir), "{\"pinned\": true}");
}

#[test]
fn a_pin_the_repository_lacks_stops_with_one_message_and_leaves_no_cache() {
    let fixture = Fixture::new();
    let absent = "0123456789abcdef0123456789abcdef01234567";
    fixture.pin(absent);

    let err = resolve_spec_dir(&fixture.project(), None, &fixture.fetcher()).unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains(absent), "{message}");
    assert!(message.contains("not our ref"), "git's reason: {message}");
    assert!(message.contains("SPEC_DIR"), "{message}");
    assert!(message.contains("cargo xtask sync-spec"), "{message}");
    assert!(
        fixture.cache_entries().is_empty(),
        "{:?}",
        fixture.cache_entries()
    );
}

#[test]
fn offline_stops_with_one_message_naming_both_ways_out() {
    let fixture = Fixture::new();
    let fetcher = fixture.unreachable();

    let err = resolve_spec_dir(&fixture.project(), None, &fetcher).unwrap_err();
    let message = format!("{err:#}");
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(
        message.starts_with(&format!(
            "cannot fetch the specifications repository at commit {}",
            fixture.pinned
        )),
        "{message}"
    );
    assert!(message.contains(&fetcher.url), "{message}");
    assert!(message.contains("set SPEC_DIR"), "{message}");
    assert!(
        message.contains("`cargo xtask sync-spec <checkout>`"),
        "{message}"
    );
    assert!(
        fixture.cache_entries().is_empty(),
        "{:?}",
        fixture.cache_entries()
    );
}

#[test]
fn spec_dir_and_synced_data_are_used_without_fetching() {
    let fixture = Fixture::new();
    let project = fixture.project();
    let offline = fixture.unreachable();

    let checkout = fixture.dir.path().join("checkout");
    fs::create_dir_all(checkout.join("source")).unwrap();
    fs::create_dir_all(fixture.root().join("spec-tests/data/source")).unwrap();
    let found = resolve_spec_dir(&project, Some(checkout.clone().into()), &offline).unwrap();
    assert_eq!(found.origin, SpecOrigin::EnvVar);
    assert_eq!(found.dir, checkout.canonicalize().unwrap());

    let found = resolve_spec_dir(&project, None, &offline).unwrap();
    assert_eq!(found.origin, SpecOrigin::Synced);
    assert!(fixture.cache_entries().is_empty());
}
