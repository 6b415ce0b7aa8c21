//! Finds the JSON suites under a data root laid out like the specifications repository:
//! `<root>/source/<spec>/tests/**/*.json`. When a spec's `tests/` has a `unified/` directory only
//! that is used (the other directories hold legacy formats).

use std::path::{Path, PathBuf};

/// A suite to run: a spec directory and, optionally, one directory below its `tests/`.
#[derive(Debug, Clone, Copy)]
pub struct Suite {
    pub spec: &'static str,
    pub subdir: Option<&'static str>,
}

/// The unified-format suites this project runs.
pub const UNIFIED_SUITES: &[Suite] = &[
    Suite {
        spec: "client-backpressure",
        subdir: None,
    },
    Suite {
        spec: "retryable-reads",
        subdir: None,
    },
    Suite {
        spec: "retryable-writes",
        subdir: None,
    },
    Suite {
        spec: "transactions",
        subdir: None,
    },
    Suite {
        spec: "server-discovery-and-monitoring",
        subdir: None,
    },
    Suite {
        spec: "client-side-operations-timeout",
        subdir: None,
    },
    Suite {
        spec: "unified-test-format",
        subdir: Some("valid-pass"),
    },
    Suite {
        spec: "crud",
        subdir: None,
    },
    Suite {
        spec: "collection-management",
        subdir: None,
    },
    Suite {
        spec: "index-management",
        subdir: None,
    },
    Suite {
        spec: "sessions",
        subdir: None,
    },
    Suite {
        spec: "change-streams",
        subdir: None,
    },
    // Its `monitoring/` and `logging/` directories both run; case names keep the directory.
    Suite {
        spec: "command-logging-and-monitoring",
        subdir: None,
    },
    Suite {
        spec: "run-command",
        subdir: None,
    },
];

/// The unified format's `valid-fail` files: valid tests a conforming runner must fail. Run
/// apart from the other suites, with the verdict inverted (see `valid_fail`).
pub const VALID_FAIL_SUITE: Suite = Suite {
    spec: "unified-test-format",
    subdir: Some("valid-fail"),
};

/// The URI options suite (its own, non-unified format).
pub const URI_OPTIONS_SUITE: Suite = Suite {
    spec: "uri-options",
    subdir: None,
};

/// One JSON file of a suite.
#[derive(Debug, Clone)]
pub struct SpecFile {
    /// The spec directory name, e.g. `retryable-reads`.
    pub spec: String,
    /// The file's path below the suite directory without `.json` (`/`-separated), so files of
    /// the same name in two subdirectories keep apart names.
    pub stem: String,
    pub path: PathBuf,
}

impl SpecFile {
    /// `<spec>/<file-stem>`: the prefix of every case name from this file.
    pub fn name(&self) -> String {
        format!("{}/{}", self.spec, self.stem)
    }
}

/// Where the data root was found, and how.
#[derive(Debug, Clone)]
pub struct DataRoot {
    pub path: PathBuf,
    pub origin: &'static str,
}

/// The specifications commit pinned in `spec-tests/SPEC_COMMIT`: its one line that is neither
/// blank nor a `#` comment. `cargo xtask test` fetches it when no other data is there.
pub fn pinned_commit() -> Option<&'static str> {
    include_str!("../SPEC_COMMIT")
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
}

/// Resolves the data root, first match wins: `SPEC_DIR` (relative paths against the current
/// directory), else `spec-tests/data/` (from `cargo xtask sync-spec`), else the pinned commit
/// as `cargo xtask test` fetched it into `target/spec-cache/<commit>`. The root must contain
/// `source/`; otherwise the error says how to get it. A `SPEC_DIR` without it is an error, never
/// a reason to use other data.
pub fn data_root() -> Result<DataRoot, String> {
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let synced = package.join("data");
    let (path, origin) = match std::env::var_os("SPEC_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            let dir = if dir.is_absolute() {
                dir
            } else {
                invocation_dir()?.join(dir)
            };
            (dir, "SPEC_DIR")
        }
        _ if synced.join("source").is_dir() => (synced, "the default spec-tests/data/"),
        _ => match pinned_commit() {
            // xtask renames a fetch into this directory only once it holds the pinned commit.
            Some(commit) => (
                package
                    .parent()
                    .unwrap_or(package)
                    .join("target/spec-cache")
                    .join(commit),
                "the pinned commit fetched by `cargo xtask test`",
            ),
            None => (synced, "the default spec-tests/data/"),
        },
    };
    if !path.join("source").is_dir() {
        return Err(format!(
            "no spec test data: {} (from {origin}) has no `source/` directory. Run `cargo xtask \
             test` once to fetch the pinned specifications commit, set SPEC_DIR to a checkout of \
             the specifications repository (the directory holding `source/`), or run \
             `cargo xtask sync-spec <dir>` to copy the suites into spec-tests/data/.",
            path.display()
        ));
    }
    Ok(DataRoot { path, origin })
}

/// The directory the user ran the command from. `cargo test` starts test binaries in the
/// package directory, so the shell's `PWD` (inherited, and absolute) is preferred when it names
/// an existing directory.
fn invocation_dir() -> Result<PathBuf, String> {
    if let Some(pwd) = std::env::var_os("PWD").map(PathBuf::from) {
        if pwd.is_absolute() && pwd.is_dir() {
            return Ok(pwd);
        }
    }
    std::env::current_dir().map_err(|e| format!("cannot resolve SPEC_DIR: {e}"))
}

/// The JSON files of `suite` under `root`, sorted by path. A suite directory that is missing is
/// an error: a misspelt or absent suite must not pass by running nothing.
pub fn suite_files(root: &Path, suite: Suite) -> Result<Vec<SpecFile>, String> {
    let tests = root.join("source").join(suite.spec).join("tests");
    let dir = match suite.subdir {
        Some(sub) => tests.join(sub),
        None if tests.join("unified").is_dir() => tests.join("unified"),
        None => tests,
    };
    if !dir.is_dir() {
        return Err(format!(
            "suite {}: {} is not a directory",
            suite.spec,
            dir.display()
        ));
    }
    let mut paths = Vec::new();
    collect_json(&dir, &mut paths).map_err(|e| format!("suite {}: {e}", suite.spec))?;
    paths.sort();
    if paths.is_empty() {
        return Err(format!(
            "suite {}: no JSON files under {}",
            suite.spec,
            dir.display()
        ));
    }
    Ok(paths
        .into_iter()
        .map(|path| SpecFile {
            spec: suite.spec.to_string(),
            stem: relative_stem(&dir, &path),
            path,
        })
        .collect())
}

/// `path` below `dir`, components joined by `/`, without the `.json` extension.
fn relative_stem(dir: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(dir).unwrap_or(path).with_extension("");
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_json(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_is_a_full_commit_id() {
        let commit = pinned_commit().expect("spec-tests/SPEC_COMMIT names a commit");
        assert_eq!(commit.len(), 40, "{commit}");
        assert!(
            commit.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
            "{commit}"
        );
    }

    #[test]
    fn walks_nested_directories_and_prefers_unified() {
        let root = std::env::temp_dir().join(format!("spec-discovery-{}", std::process::id()));
        let tests = root.join("source/demo/tests");
        std::fs::create_dir_all(tests.join("unified/deeper")).unwrap();
        std::fs::create_dir_all(tests.join("legacy")).unwrap();
        std::fs::write(tests.join("unified/a.json"), "{}").unwrap();
        std::fs::write(tests.join("unified/deeper/b.json"), "{}").unwrap();
        std::fs::write(tests.join("unified/notes.yml"), "").unwrap();
        std::fs::write(tests.join("legacy/c.json"), "{}").unwrap();
        let files = suite_files(
            &root,
            Suite {
                spec: "demo",
                subdir: None,
            },
        )
        .unwrap();
        let names: Vec<_> = files.iter().map(SpecFile::name).collect();
        assert_eq!(names, ["demo/a", "demo/deeper/b"]);
        assert!(suite_files(
            &root,
            Suite {
                spec: "absent",
                subdir: None
            }
        )
        .is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
