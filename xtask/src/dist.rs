//! `cargo xtask dist`: the fork as a standalone crate that an application can point
//! `[patch.crates-io]` at without building the fork first.
//!
//! A release is the generated `driver/` (pinned upstream plus the series) made self-contained:
//!
//! - **`overload` travels inside the crate**, as the private module `mongodb::fork::overload`
//!   (`src/fork/overload/`), with the driver's `overload::` paths and the crate's own `crate::`
//!   paths rewritten to it. A second crate would not do: `cargo package` strips `path` from
//!   dependencies, so the `.crate` would no longer build from the package alone, and crates.io's
//!   `overload` is an unrelated, widely used crate (operator-overloading macros) that a registry
//!   mirroring crates.io would serve in its place.
//! - **The version is `<upstream>+overload.<N>`**: semver build metadata, so `mongodb = "3"` and
//!   `[patch.crates-io]` accept it like upstream's own `<upstream>`, while `Cargo.lock`, the
//!   `.crate` file's name and the handshake name the fork release. A pre-release suffix would not
//!   match `"3"`, and a higher patch number would claim an upstream release that does not exist.
//! - **One commit per release on the branch `dist/<upstream>`**, tagged `v<version>`, in the
//!   repository given (this project's by default). The release number is the branch tip's plus
//!   one; when the tree built with the tip's number equals the tip's tree, nothing is committed.
//! - **A `.crate` file** made by `cargo package` from that commit.
//!
//! docs/patch-workflow.md "Releases" gives the reasons at more length.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use toml_edit::{DocumentMut, Item, Table, Value};

use crate::fork::{DriverOutcome, Workspace};
use crate::git::Git;
use crate::series;

/// The build-metadata prefix of a release version: `3.9.1+overload.4` is release 4 on 3.9.1.
pub const RELEASE_METADATA: &str = "overload.";

/// Where the fork's `overload` crate lives inside a release, relative to the crate root.
pub const VENDORED_DIR: &str = "src/fork/overload";

/// The Rust path of the vendored module, which replaces the `overload` crate's name and `crate`.
const VENDORED_PATH: &str = "crate::fork::overload::";

/// `3.9.1` and release 4 give `3.9.1+overload.4`.
pub fn release_version(upstream: &str, number: u64) -> String {
    format!("{upstream}+{RELEASE_METADATA}{number}")
}

/// The release number in a version made by [`release_version`]; `None` for any other version.
pub fn release_number(version: &str) -> Option<u64> {
    let (_, metadata) = version.split_once('+')?;
    let number = metadata.strip_prefix(RELEASE_METADATA)?;
    number.parse().ok().filter(|n| *n > 0)
}

/// The tag a release gets: `v3.9.1+overload.4`.
pub fn tag_name(version: &str) -> String {
    format!("v{version}")
}

/// The branch holding every release on one upstream version: `dist/3.9.1`.
pub fn branch_name(upstream: &str) -> String {
    format!("dist/{upstream}")
}

/// Replaces every path that starts with `root` (e.g. `overload::`) by `replacement`, where `root`
/// begins a path: not right after an identifier character, `:`, `$` or `.`. Comments and doc links
/// are rewritten too, so that they keep pointing at the same item.
pub fn rewrite_path_root(text: &str, root: &str, replacement: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(root) {
        let before = rest[..at].chars().next_back().or(out.chars().next_back());
        let starts_path =
            !matches!(before, Some(c) if c.is_alphanumeric() || matches!(c, '_' | ':' | '$' | '.'));
        out.push_str(&rest[..at]);
        out.push_str(if starts_path { replacement } else { root });
        rest = &rest[at + root.len()..];
    }
    out.push_str(rest);
    out
}

/// One source file of the `overload` crate as a module of the release: its `crate::` and
/// `$crate::` paths point at the vendored module, and its features are the driver's features
/// that enable them (`feature = "metrics"` becomes `feature = "overload-metrics"`).
pub fn vendor_overload_source(text: &str, features: &BTreeMap<String, String>) -> String {
    let mut text = rewrite_path_root(text, "crate::", VENDORED_PATH);
    text = text.replace(
        "$crate::",
        &format!("$crate::{}", &VENDORED_PATH["crate::".len()..]),
    );
    for (own, driver) in features {
        text = text.replace(
            &format!("feature = \"{own}\""),
            &format!("feature = \"{driver}\""),
        );
    }
    text
}

/// The version of the project's `overload` crate: the fork's version in builds from the
/// repository (`mongodb::fork::FORK_VERSION`), where the driver is upstream's version exactly.
pub fn overload_version(project: &crate::project::Project) -> Result<String> {
    let path = project.root().join("overload/Cargo.toml");
    let doc: DocumentMut = fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .parse()?;
    Ok(doc["package"]["version"]
        .as_str()
        .context("overload/Cargo.toml has no version")?
        .to_owned())
}

/// The release's manifest and how the `overload` crate's features map onto the driver's.
#[derive(Debug)]
pub struct ReleaseManifest {
    pub text: String,
    /// `overload` feature name -> the driver feature that enables it.
    pub features: BTreeMap<String, String>,
}

/// Turns `driver/Cargo.toml` into the release's manifest: the release version, no `overload`
/// dependency, the `overload` crate's dependencies merged in (a driver dependency that
/// `overload` needs becomes non-optional), and each driver feature that enabled an `overload`
/// feature (`overload/metrics`) enabling what that feature enabled instead.
pub fn release_manifest(
    driver_manifest: &str,
    overload_manifest: &str,
    version: &str,
) -> Result<ReleaseManifest> {
    let mut doc: DocumentMut = driver_manifest
        .parse()
        .context("driver/Cargo.toml is not valid TOML")?;
    let overload: DocumentMut = overload_manifest
        .parse()
        .context("overload/Cargo.toml is not valid TOML")?;
    doc["package"]["version"] = toml_edit::value(version);
    doc["package"]["description"] = toml_edit::value(
        "The official MongoDB driver for Rust with the mongodb-overload fork's patches: \
         overload-aware retries, timeoutMS, a retry budget and admission control",
    );

    let deps = doc["dependencies"]
        .as_table_mut()
        .context("driver/Cargo.toml has no [dependencies] table")?;
    ensure!(
        deps.remove("overload").is_some(),
        "driver/Cargo.toml does not depend on `overload`; nothing to carry into the release"
    );
    let mut now_required = Vec::new();
    if let Some(own) = overload.get("dependencies").and_then(Item::as_table_like) {
        for (name, spec) in own.iter() {
            let spec = dependency_table(name, spec)?;
            let optional = spec
                .get("optional")
                .and_then(Item::as_bool)
                .unwrap_or(false);
            match deps.get_mut(name) {
                None => {
                    deps.insert(name, Item::Table(spec));
                }
                Some(_) if optional => bail!(
                    "overload's optional dependency `{name}` is also a driver dependency; \
                     decide by hand how the release should merge them"
                ),
                Some(existing) => {
                    let theirs = requirement(existing).unwrap_or_default();
                    let ours = requirement(&Item::Table(spec.clone())).unwrap_or_default();
                    ensure!(
                        same_compatible_range(&theirs, &ours),
                        "overload needs {name} {ours} but the driver has {theirs}"
                    );
                    let table = existing
                        .as_table_like_mut()
                        .with_context(|| format!("driver dependency `{name}` is not a table"))?;
                    if table.remove("optional").is_some() {
                        now_required.push(name.to_owned());
                    }
                }
            }
        }
    }

    let overload_features: BTreeMap<String, Vec<String>> = overload
        .get("features")
        .and_then(Item::as_table_like)
        .map(|t| {
            t.iter()
                .map(|(k, v)| (k.to_owned(), string_array(v)))
                .collect()
        })
        .unwrap_or_default();
    let mut features = BTreeMap::new();
    let table = doc["features"]
        .as_table_like_mut()
        .context("driver/Cargo.toml has no [features] table")?;
    for (name, item) in table.iter_mut() {
        let Some(list) = item.as_array_mut() else {
            continue;
        };
        let mut entries: Vec<String> = Vec::new();
        for entry in list.iter().filter_map(Value::as_str) {
            if let Some(feature) = entry.strip_prefix("overload/") {
                let enabled = overload_features.get(feature).with_context(|| {
                    format!("driver feature `{name}` enables unknown overload/{feature}")
                })?;
                features.insert(feature.to_owned(), name.get().to_owned());
                entries.extend(enabled.iter().cloned());
            } else if entry
                .strip_prefix("dep:")
                .is_some_and(|dep| now_required.iter().any(|r| r == dep))
            {
                // The dependency is always built now; `dep:` on a required one is an error.
            } else {
                entries.push(entry.to_owned());
            }
        }
        *list = entries.iter().map(String::as_str).collect();
    }
    for feature in overload_features.keys() {
        ensure!(
            features.contains_key(feature),
            "no driver feature enables overload/{feature}; add one (like `overload-metrics`)"
        );
    }
    Ok(ReleaseManifest {
        text: doc.to_string(),
        features,
    })
}

fn dependency_table(name: &str, spec: &Item) -> Result<Table> {
    let mut table = Table::new();
    match spec {
        Item::Value(Value::String(req)) => {
            table.insert("version", toml_edit::value(req.value().as_str()));
        }
        other => {
            let like = other.as_table_like().with_context(|| {
                format!("overload dependency `{name}` is neither a string nor a table")
            })?;
            ensure!(
                like.get("path").is_none() && like.get("git").is_none(),
                "overload dependency `{name}` is not from crates.io; a release cannot carry it"
            );
            for (key, value) in like.iter() {
                table.insert(key, value.clone());
            }
        }
    }
    Ok(table)
}

fn requirement(item: &Item) -> Option<String> {
    match item {
        Item::Value(Value::String(s)) => Some(s.value().clone()),
        other => other
            .as_table_like()?
            .get("version")?
            .as_str()
            .map(str::to_owned),
    }
}

/// Whether two caret requirements (`0.1` and `0.1.36`, `1` and `1.2`) select one semver range.
fn same_compatible_range(a: &str, b: &str) -> bool {
    fn range(req: &str) -> Option<(u64, Option<u64>)> {
        let req = req.trim().trim_start_matches('^');
        let mut parts = req.split('.').map(|p| p.parse::<u64>().ok());
        let major = parts.next()??;
        let minor = parts.next().flatten();
        Some(if major == 0 {
            (0, minor)
        } else {
            (major, None)
        })
    }
    range(a).is_some() && range(a) == range(b)
}

fn string_array(item: &Item) -> Vec<String> {
    item.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// What `cargo xtask dist` is asked to do.
#[derive(Clone, Debug)]
pub struct DistOptions {
    /// The git repository that gets the branch and the tag (the project's own by default).
    pub repo: PathBuf,
    /// Where the `.crate` file is copied.
    pub out_dir: PathBuf,
    /// Whether `cargo package` builds the package from the archive alone (slow: the driver
    /// compiles once more). `cargo xtask test` skips it because it builds the `.crate` itself.
    pub verify: bool,
}

/// The outcome of `cargo xtask dist`.
#[derive(Debug)]
pub struct Release {
    pub version: String,
    pub branch: String,
    pub tag: String,
    pub commit: String,
    /// False when the sources were unchanged and the branch tip is the release.
    pub new_commit: bool,
    pub crate_file: PathBuf,
}

impl Workspace {
    /// `cargo xtask dist`: commits the release tree to `dist/<upstream>` (when it changed), tags
    /// it, and packages it as a `.crate` file.
    pub fn dist(&self, options: &DistOptions) -> Result<Release> {
        if let DriverOutcome::Built { patches } = self.build_driver(false)? {
            println!("built driver/ with {patches} patches");
        }
        let driver = self.project.driver_dir();
        let dirty = self.git.uncommitted(&driver)?;
        ensure!(
            dirty.trim().is_empty(),
            "driver/ has uncommitted changes; a release is made from the series alone:\n{dirty}"
        );
        let upstream = self.project.upstream()?;
        let staging = tempfile::tempdir()?;
        let tree = staging.path().join("mongodb");
        fs::create_dir_all(&tree)?;
        let published = publish(
            &self.git,
            &options.repo,
            &branch_name(&upstream.version),
            &tree,
            |dir, number| self.write_release_tree(dir, &release_version(&upstream.version, number)),
        )?;
        let crate_file = package(
            &tree,
            &self.project.root().join("Cargo.lock"),
            &self.project.root().join("target"),
            &options.out_dir,
            &published.version,
            options.verify,
        )?;
        Ok(Release {
            branch: branch_name(&upstream.version),
            tag: tag_name(&published.version),
            version: published.version,
            commit: published.commit,
            new_commit: published.new_commit,
            crate_file,
        })
    }

    /// Writes the release tree of `version` into the empty directory `dest`.
    pub fn write_release_tree(&self, dest: &Path, version: &str) -> Result<()> {
        let root = self.project.root();
        let driver = self.project.driver_dir();
        let archive = self
            .git
            .output(&driver, ["archive", "--format=tar", "HEAD"])?;
        ensure!(
            archive.status.success(),
            "git archive of driver/ failed: {}",
            String::from_utf8_lossy(&archive.stderr).trim()
        );
        tar::Archive::new(archive.stdout.as_slice())
            .unpack(dest)
            .context("cannot unpack driver/'s tree")?;
        // Upstream's packaging leftovers: cargo writes its own `.orig`, VCS info and lock file.
        for leftover in ["Cargo.toml.orig", ".cargo_vcs_info.json", "Cargo.lock"] {
            let path = dest.join(leftover);
            if path.exists() {
                fs::remove_file(&path)?;
            }
        }
        let upstream_readme =
            fs::read_to_string(dest.join("README.md")).context("driver/ has no README.md")?;

        let manifest = release_manifest(
            &fs::read_to_string(driver.join("Cargo.toml"))?,
            &fs::read_to_string(root.join("overload/Cargo.toml"))?,
            version,
        )?;
        fs::write(dest.join("Cargo.toml"), &manifest.text)?;

        // The driver's `overload::` paths, then the module they now name.
        for file in rust_files(&dest.join("src"))? {
            let text = fs::read_to_string(&file)?;
            let rewritten = rewrite_path_root(&text, "overload::", VENDORED_PATH);
            if rewritten != text {
                fs::write(&file, rewritten)?;
            }
        }
        let vendored = dest.join(VENDORED_DIR);
        ensure!(
            !vendored.exists(),
            "driver/ already has {VENDORED_DIR}; the release cannot carry `overload` there"
        );
        let overload_src = root.join("overload/src");
        for file in rust_files(&overload_src)? {
            let relative = file.strip_prefix(&overload_src)?;
            let target = if relative == Path::new("lib.rs") {
                vendored.join("mod.rs")
            } else {
                vendored.join(relative)
            };
            fs::create_dir_all(target.parent().context("no parent")?)?;
            let text = fs::read_to_string(&file)?;
            fs::write(&target, vendor_overload_source(&text, &manifest.features))?;
        }
        let fork_rs = dest.join("src/fork.rs");
        let mut fork = fs::read_to_string(&fork_rs).context("driver/ has no src/fork.rs")?;
        fork.push_str(
            "\n// Added by `cargo xtask dist`: the fork's `overload` crate, carried inside the release so\n\
             // that the package builds alone. Parts of it serve only the fork's tests and tools.\n\
             #[allow(dead_code, unused_imports)]\n\
             pub(crate) mod overload;\n",
        );
        fs::write(&fork_rs, fork)?;

        for file in ["LICENSE", "NOTICE", "CHANGELOG.md"] {
            fs::copy(root.join(file), dest.join(file))
                .with_context(|| format!("cannot copy {file} into the release"))?;
        }
        fs::write(dest.join(".gitignore"), "/Cargo.lock\n/target/\n")?;
        let upstream = self.project.upstream()?;
        let patches: Vec<String> = series::read(&self.project)?
            .into_iter()
            .map(|p| p.file)
            .collect();
        let options = readme_section(&fs::read_to_string(root.join("README.md"))?, "## Options")
            .map(|section| unlink_relative(&section))
            .unwrap_or_default();
        // Upstream's `src/lib.rs` makes README.md the crate's top-level documentation, so the
        // release's README comes first and upstream's follows whole: docs.rs then shows what the
        // release is, its options, and everything upstream documents there.
        fs::write(
            dest.join("README.md"),
            format!(
                "{}\n---\n\n# Upstream's README\n\n{upstream_readme}",
                release_readme(version, &upstream.version, &patches, &options)
            ),
        )?;
        Ok(())
    }
}

/// Every `.rs` file under `dir`, sorted, so that releases are built in the same order everywhere.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The section of a markdown document that starts with the line `heading`, up to the next
/// heading of the same level.
pub fn readme_section(markdown: &str, heading: &str) -> Option<String> {
    let start = markdown.lines().position(|l| l.trim_end() == heading)?;
    let level = heading.split(' ').next().unwrap_or("##");
    let lines: Vec<&str> = markdown
        .lines()
        .skip(start + 1)
        .take_while(|l| !(l.starts_with(level) && l[level.len()..].starts_with(' ')))
        .collect();
    Some(lines.join("\n").trim().to_owned())
}

/// Markdown links to files of the repository (`[text](docs/x.md)`) with their text kept and the
/// link dropped: the release does not carry `docs/`, so on a registry or docs.rs they would lead
/// nowhere. Links with a scheme (`https://…`) stay.
pub fn unlink_relative(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut rest = markdown;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let link = after.find("](").and_then(|close| {
            let target_start = close + 2;
            let end = after[target_start..].find(')')? + target_start;
            let text = &after[..close];
            let target = &after[target_start..end];
            (!text.contains('[')
                && !target.contains("://")
                && !target.contains(char::is_whitespace))
            .then_some((text, end))
        });
        match link {
            Some((text, end)) => {
                out.push_str(&rest[..open]);
                out.push_str(text);
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[..open + 1]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The release's README: what it is, how to take it, the options it adds, where it comes from.
pub fn release_readme(version: &str, upstream: &str, patches: &[String], options: &str) -> String {
    let tag = tag_name(version);
    let mut list = String::new();
    for patch in patches {
        list.push_str(&format!("- `{patch}`\n"));
    }
    format!(
        "# mongodb {version}: the mongodb-overload fork of the MongoDB Rust driver\n\
         \n\
         This is upstream `mongodb` {upstream} (crates.io) with the patch series of\n\
         **mongodb-overload**, an overload-aware fork: Client Backpressure retries with backoff, and,\n\
         opt-in, `timeoutMS`, a client-wide retry budget and adaptive admission control.\n\
         It keeps upstream's crate name and API, so an application takes it with one line:\n\
         \n\
         ```toml\n\
         [dependencies]\n\
         mongodb = \"3\"\n\
         \n\
         [patch.crates-io]\n\
         mongodb = {{ git = \"<the repository holding this release>\", tag = \"{tag}\" }}\n\
         ```\n\
         \n\
         or `mongodb = {{ version = \"={version}\", registry = \"<yours>\" }}` under\n\
         `[patch.crates-io]` once the `.crate` file is in a private registry, or\n\
         `mongodb = {{ path = \"vendor/mongodb\" }}` with this tree vendored. The first time,\n\
         run `cargo update -p mongodb` so that `Cargo.lock` moves from upstream's `{upstream}` to\n\
         `{version}` (cargo warns that the patch is unused until then).\n\
         \n\
         At run time `mongodb::fork::IDENTITY` prints `mongodb-overload {version} (upstream\n\
         mongodb {upstream})`, and every connection handshake adds `mongodb-overload` and\n\
         `{version}` to the driver metadata that server logs show.\n\
         \n\
         ## Overload handling and `timeoutMS`\n\
         \n\
         Every command is retried on a retryable overload error (labels `SystemOverloadedError`\n\
         and `RetryableError`) at most `maxAdaptiveRetries` times (default 2), with full-jitter\n\
         exponential backoff (base 100 ms, or the `baseBackoffMS` the server's error carries).\n\
         A client-wide retry budget\n\
         (`retryBudget=true`) caps retries at a share of first attempts, and\n\
         `Client::overload_stats()` reports what was retried, refused and rejected (also\n\
         through the `metrics` facade with the `overload-metrics` feature). Admission control\n\
         per server (`adaptiveThrottle`, `adaptiveConcurrency`) rejects or queues work locally\n\
         while a server sheds load. `timeoutMS` gives each operation one deadline that bounds\n\
         server selection, checkout, the command (sent with `maxTimeMS`) and every retry;\n\
         cursors follow `timeoutMode`, and sessions, transactions and GridFS calls are bounded\n\
         too. Everything beyond the overload retries is opt-in.\n\
         \n\
         ## Options\n\
         \n\
         {options}\n\
         \n\
         ## What is in this release\n\
         \n\
         Release {version} was made by `cargo xtask dist` in the mongodb-overload repository:\n\
         pristine `mongodb` {upstream}, checked against the SHA-256 pinned in\n\
         `patches/UPSTREAM`, with these patches of `patches/series` applied in order:\n\
         \n\
         {list}\n\
         The fork's policies live in its `overload` crate (`overload/` in the repository); this\n\
         release carries it as the private module `mongodb::fork::overload`\n\
         (`{VENDORED_DIR}/`), so the package builds alone. The repository's `README.md`,\n\
         `docs/` and `patches/` explain each change; `CHANGELOG.md` here is the fork's changelog\n\
         at this release, and upstream's README follows below. Licensed under\n\
         Apache-2.0 like upstream: see `LICENSE` and `NOTICE`.\n"
    )
}

/// What `cargo xtask dist` prints.
pub fn print(release: &Release) {
    if release.new_commit {
        println!(
            "released {} as {} on {}",
            release.version, release.commit, release.branch
        );
    } else {
        println!(
            "sources unchanged: {} ({} on {}) is the release",
            release.version, release.commit, release.branch
        );
    }
    println!("tag {}", release.tag);
    println!("crate {}", release.crate_file.display());
}

/// The outcome of [`publish`].
#[derive(Debug)]
pub struct Published {
    pub version: String,
    pub commit: String,
    pub new_commit: bool,
}

/// Commits the tree `write_tree(dir, release_number)` writes as the next release on `branch` of
/// `repo` and tags it, unless the tree built with the branch tip's release number equals the
/// tip's, in which case the tip is the release. `tree` is left a git checkout of the release
/// commit (for `cargo package`).
pub fn publish(
    git: &Git,
    repo: &Path,
    branch: &str,
    tree: &Path,
    write_tree: impl Fn(&Path, u64) -> Result<()>,
) -> Result<Published> {
    let repo_arg = repo.as_os_str().to_owned();
    git.run(tree, ["init", "--quiet", "--initial-branch=release"])?;
    let parent = [
        format!("refs/heads/{branch}"),
        format!("refs/remotes/origin/{branch}"),
    ]
    .into_iter()
    .find(|r| {
        git.output(
            repo,
            [
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{r}^{{commit}}"),
            ],
        )
        .is_ok_and(|o| o.status.success())
    });
    let tip = match &parent {
        Some(reference) => {
            git.run(
                tree,
                [
                    OsString::from("fetch"),
                    "--quiet".into(),
                    repo_arg.clone(),
                    reference.into(),
                ],
            )?;
            let commit = git
                .run(tree, ["rev-parse", "FETCH_HEAD^{commit}"])?
                .trim()
                .to_owned();
            let manifest = git.run(tree, ["show", &format!("{commit}:Cargo.toml")])?;
            let doc: DocumentMut = manifest.parse().context("the branch tip's Cargo.toml")?;
            let version = doc["package"]["version"].as_str().unwrap_or_default();
            let number = release_number(version).with_context(|| {
                format!("{branch} ends in version `{version}`, not one `cargo xtask dist` made")
            })?;
            Some((commit, number))
        }
        None => None,
    };

    let stage = |number: u64| -> Result<String> {
        clear_except_git(tree)?;
        write_tree(tree, number)?;
        git.run(tree, ["add", "--all"])?;
        Ok(git.run(tree, ["write-tree"])?.trim().to_owned())
    };
    let (commit, number, new_commit) = match &tip {
        Some((commit, number)) if stage(*number)? == git.tree_of(tree, commit)? => {
            (commit.clone(), *number, false)
        }
        _ => {
            let number = tip.as_ref().map_or(1, |(_, n)| n + 1);
            let tree_id = stage(number)?;
            let mut args: Vec<OsString> = vec!["commit-tree".into(), tree_id.into()];
            if let Some((parent, _)) = &tip {
                args.extend(["-p".into(), parent.into()]);
            }
            let message = format!(
                "mongodb release {number} on upstream {}\n\nMade by `cargo xtask dist` from \
                 patches/UPSTREAM, patches/series and overload/.",
                branch.trim_start_matches("dist/")
            );
            args.extend(["-m".into(), message.into()]);
            (git.run(tree, args)?.trim().to_owned(), number, true)
        }
    };
    git.run(tree, ["update-ref", "HEAD", &commit])?;
    git.run(tree, ["reset", "--quiet"])?;
    let version = {
        let manifest = fs::read_to_string(tree.join("Cargo.toml"))?;
        let doc: DocumentMut = manifest.parse()?;
        doc["package"]["version"]
            .as_str()
            .context("the release manifest has no version")?
            .to_owned()
    };
    ensure!(
        release_number(&version) == Some(number),
        "the release tree's version `{version}` does not carry release number {number}"
    );

    // The branch (made or moved) and the tag, in one push; a tag on another commit is an error.
    let tag = tag_name(&version);
    let mut refspecs = Vec::new();
    let local_tip = git.output(
        repo,
        [
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ],
    )?;
    if String::from_utf8_lossy(&local_tip.stdout).trim() != commit {
        refspecs.push(format!("{commit}:refs/heads/{branch}"));
    }
    let tagged = git.output(
        repo,
        [
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/tags/{tag}^{{commit}}"),
        ],
    )?;
    let tagged = String::from_utf8_lossy(&tagged.stdout).trim().to_owned();
    if tagged.is_empty() {
        refspecs.push(format!("{commit}:refs/tags/{tag}"));
    } else {
        ensure!(
            tagged == commit,
            "tag {tag} already names commit {tagged}, not the release {commit}; a release tag \
             never moves (delete it by hand if it was made by mistake)"
        );
    }
    if !refspecs.is_empty() {
        let mut args: Vec<OsString> = vec!["push".into(), "--quiet".into(), repo_arg];
        args.extend(refspecs.into_iter().map(OsString::from));
        git.run(tree, args)?;
    }
    Ok(Published {
        version,
        commit,
        new_commit,
    })
}

/// Empties a checkout, keeping its `.git`.
fn clear_except_git(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.file_name().is_some_and(|n| n == ".git") {
            continue;
        }
        if path.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// `cargo package` of the release checkout `tree`, with `lock` (the project's) as the starting
/// point of its lock file, so the package resolves to versions already fetched. Returns the copy
/// of the `.crate` in `out_dir`.
pub fn package(
    tree: &Path,
    lock: &Path,
    target_dir: &Path,
    out_dir: &Path,
    version: &str,
    verify: bool,
) -> Result<PathBuf> {
    fs::copy(lock, tree.join("Cargo.lock")).context("cannot seed the release's lock file")?;
    let mut cargo = crate::project::cargo_command();
    cargo
        .args(["package", "--quiet", "--manifest-path"])
        .arg(tree.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    if !verify {
        cargo.arg("--no-verify");
    }
    let status = cargo.status().context("cannot run cargo package")?;
    ensure!(status.success(), "cargo package of the release failed");
    let name = format!("mongodb-{version}.crate");
    let made = target_dir.join("package").join(&name);
    fs::create_dir_all(out_dir)?;
    let copy = out_dir.join(&name);
    fs::copy(&made, &copy).with_context(|| format!("cargo package made no {}", made.display()))?;
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn release_versions_round_trip() {
        let version = release_version("3.9.1", 4);
        assert_eq!(version, "3.9.1+overload.4");
        assert_eq!(release_number(&version), Some(4));
        assert_eq!(tag_name(&version), "v3.9.1+overload.4");
        assert_eq!(branch_name("3.9.1"), "dist/3.9.1");
        for other in [
            "3.9.1",
            "3.9.1+overload.",
            "3.9.1+overload.0",
            "3.9.1+other.2",
        ] {
            assert_eq!(release_number(other), None, "{other}");
        }
    }

    #[test]
    fn rewrites_only_paths_that_start_with_the_root() {
        let driver = "use overload::retry::RetryState;\n\
                      fn f() -> Option<overload::cursor::CursorRequest> { None }\n\
                      // see `overload::control::MAX`\n\
                      let t = \"mongodb::overload::retry\"; x.overload::y; my_overload::z;";
        assert_eq!(
            rewrite_path_root(driver, "overload::", VENDORED_PATH),
            "use crate::fork::overload::retry::RetryState;\n\
             fn f() -> Option<crate::fork::overload::cursor::CursorRequest> { None }\n\
             // see `crate::fork::overload::control::MAX`\n\
             let t = \"mongodb::overload::retry\"; x.overload::y; my_overload::z;"
        );
        let own = "use crate::deadline::Deadline;\npub(crate) fn f() {}\npub(in crate::budget) g;\n\
                   macro_rules! m { () => { $crate::trace::TARGET } }\n#[cfg(feature = \"metrics\")]";
        let features = BTreeMap::from([("metrics".to_owned(), "overload-metrics".to_owned())]);
        assert_eq!(
            vendor_overload_source(own, &features),
            "use crate::fork::overload::deadline::Deadline;\npub(crate) fn f() {}\n\
             pub(in crate::fork::overload::budget) g;\n\
             macro_rules! m { () => { $crate::fork::overload::trace::TARGET } }\n\
             #[cfg(feature = \"overload-metrics\")]"
        );
    }

    const DRIVER: &str = r#"[package]
name = "mongodb"
version = "3.9.1"

[features]
overload-metrics = ["overload/metrics"]
tracing-unstable = ["dep:tracing", "log"]

[dependencies.overload]
path = "../overload"
version = "0.1.0"

[dependencies.rand]
version = "0.9"
features = ["small_rng"]

[dependencies.tracing]
version = "0.1.36"
optional = true
"#;

    const OVERLOAD: &str = r#"[package]
name = "overload"
version = "0.1.0"

[dependencies]
metrics = { version = "0.24", optional = true }
rand = "0.9"
tracing = "0.1"

[features]
metrics = ["dep:metrics"]
"#;

    #[test]
    fn the_release_manifest_carries_overloads_dependencies() {
        let manifest = release_manifest(DRIVER, OVERLOAD, "3.9.1+overload.2").unwrap();
        let doc: DocumentMut = manifest.text.parse().unwrap();
        assert_eq!(doc["package"]["version"].as_str(), Some("3.9.1+overload.2"));
        let deps = doc["dependencies"].as_table().unwrap();
        assert!(deps.get("overload").is_none());
        assert_eq!(deps["metrics"]["optional"].as_bool(), Some(true));
        assert!(
            deps["tracing"].get("optional").is_none(),
            "{}",
            manifest.text
        );
        assert_eq!(deps["rand"]["features"].as_array().unwrap().len(), 1);
        assert_eq!(
            string_array(&doc["features"]["overload-metrics"]),
            ["dep:metrics"]
        );
        assert_eq!(string_array(&doc["features"]["tracing-unstable"]), ["log"]);
        assert_eq!(manifest.features["metrics"], "overload-metrics");

        let clash = OVERLOAD.replace("rand = \"0.9\"", "rand = \"0.8\"");
        let err = release_manifest(DRIVER, &clash, "3.9.1+overload.2").unwrap_err();
        assert!(err.to_string().contains("overload needs rand 0.8"), "{err}");
        let err = release_manifest(&DRIVER.replace("overload/metrics", "log"), OVERLOAD, "v")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("no driver feature enables overload/metrics"),
            "{err}"
        );
    }

    #[test]
    fn repository_links_lose_their_target_only() {
        assert_eq!(
            unlink_relative(
                "see [`docs/options.md`](docs/options.md), [a](docs/a.md#x) and \
                 [site](https://example.com/) or [x] y"
            ),
            "see `docs/options.md`, a and [site](https://example.com/) or [x] y"
        );
    }

    #[test]
    fn readme_sections_end_at_the_next_heading() {
        let md = "# T\n## Options\n\n| a |\n### Sub\nx\n## Layout\ny\n";
        assert_eq!(
            readme_section(md, "## Options").unwrap(),
            "| a |\n### Sub\nx"
        );
        assert_eq!(readme_section(md, "## Missing"), None);
    }

    /// A release tree with the version `cargo xtask dist` gives it and one file of content.
    fn fake_tree<'a>(content: &'a RefCell<&'static str>) -> impl Fn(&Path, u64) -> Result<()> + 'a {
        move |dir, number| {
            fs::write(
                dir.join("Cargo.toml"),
                format!(
                    "[package]\nname = \"mongodb\"\nversion = \"{}\"\n",
                    release_version("3.9.1", number)
                ),
            )?;
            fs::write(dir.join("lib.rs"), *content.borrow())?;
            Ok(())
        }
    }

    #[test]
    fn a_release_is_committed_once_per_change_and_tagged() {
        let git = Git::default();
        let scratch = tempfile::tempdir().unwrap();
        let repo = scratch.path().join("repo.git");
        fs::create_dir(&repo).unwrap();
        git.run(&repo, ["init", "--quiet", "--bare"]).unwrap();
        let content = RefCell::new("one");
        let run = |name: &str| {
            let tree = scratch.path().join(name);
            fs::create_dir(&tree).unwrap();
            publish(&git, &repo, "dist/3.9.1", &tree, fake_tree(&content))
        };

        let first = run("a").unwrap();
        assert_eq!(
            (first.version.as_str(), first.new_commit),
            ("3.9.1+overload.1", true)
        );
        let same = run("b").unwrap();
        assert!(!same.new_commit);
        assert_eq!(same.commit, first.commit);

        *content.borrow_mut() = "two";
        let second = run("c").unwrap();
        assert_eq!(
            (second.version.as_str(), second.new_commit),
            ("3.9.1+overload.2", true)
        );
        let log = git
            .run(&repo, ["log", "--format=%H", "dist/3.9.1"])
            .unwrap();
        assert_eq!(
            log.lines().collect::<Vec<_>>(),
            [&second.commit, &first.commit]
        );
        for (tag, commit) in [
            ("v3.9.1+overload.1", &first.commit),
            ("v3.9.1+overload.2", &second.commit),
        ] {
            let tagged = git
                .run(&repo, ["rev-parse", &format!("{tag}^{{commit}}")])
                .unwrap();
            assert_eq!(tagged.trim(), commit.as_str());
        }

        // A fresh clone has the published releases only as origin's: it continues from them.
        let clone = scratch.path().join("clone.git");
        fs::create_dir(&clone).unwrap();
        git.run(&clone, ["init", "--quiet", "--bare"]).unwrap();
        git.run(
            &clone,
            [
                "fetch",
                "--quiet",
                repo.to_str().unwrap(),
                "refs/heads/dist/3.9.1:refs/remotes/origin/dist/3.9.1",
                "refs/tags/*:refs/tags/*",
            ],
        )
        .unwrap();
        let tree = scratch.path().join("from-clone");
        fs::create_dir(&tree).unwrap();
        let continued = publish(&git, &clone, "dist/3.9.1", &tree, fake_tree(&content)).unwrap();
        assert!(!continued.new_commit);
        assert_eq!(continued.commit, second.commit);
        let local = git
            .run(&clone, ["rev-parse", "refs/heads/dist/3.9.1"])
            .unwrap();
        assert_eq!(local.trim(), second.commit.as_str());

        // A tag that names another commit is never moved.
        git.run(
            &repo,
            ["update-ref", "refs/heads/dist/3.9.1", &first.commit],
        )
        .unwrap();
        *content.borrow_mut() = "three";
        let err = run("d").unwrap_err().to_string();
        assert!(err.contains("tag v3.9.1+overload.2 already names"), "{err}");
    }
}
