//! The patch series: reading `patches/`, rendering `driver/`'s commits as patches, and the rules
//! every patch message follows (a why, and DEP-3-style fields).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::git::Git;
use crate::project::Project;

/// One patch: its file name in `patches/` and its mailbox text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    pub file: String,
    pub text: String,
}

/// Fields every patch message must end with (DEP-3 style); `Bug` is optional.
const REQUIRED_FIELDS: [&str; 3] = ["Origin", "Forwarded", "Last-Update"];

/// A description shorter than this many words cannot say both what a patch does and why.
const MIN_DESCRIPTION_WORDS: usize = 12;

/// The file, relative to the project root, whose sections a `Bug:` field links to.
pub const DEFECTS_DOC: &str = "docs/defects.md";

/// The anchors that [`DEFECTS_DOC`] defines: what `Bug: docs/defects.md#b3` may point at. An
/// anchor is a line starting with `<a id="b3">`. Only such explicit anchors count: they resolve
/// the same way on every renderer, unlike the IDs renderers derive from headings, and a line
/// start keeps an anchor quoted in running text or in a code span from counting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefectAnchors(BTreeSet<String>);

impl DefectAnchors {
    /// The anchors of the project's defects document; none when the project has no such file.
    pub fn read(project: &Project) -> Result<Self> {
        let path = project.root().join(DEFECTS_DOC);
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Self::parse(&text)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    pub fn parse(markdown: &str) -> Self {
        let anchors = markdown
            .lines()
            .filter_map(|line| {
                let (id, _) = line
                    .trim_start()
                    .strip_prefix("<a id=\"")?
                    .split_once('"')?;
                (!id.is_empty()).then(|| id.to_owned())
            })
            .collect();
        Self(anchors)
    }

    fn contains(&self, anchor: &str) -> bool {
        self.0.contains(anchor)
    }
}

/// Reads `patches/series` (one file name per line; `#` comments and blank lines ignored) and the
/// patch files it names, in order. Fails when a listed file is missing or a `.patch` file is not
/// listed, since either means the series and the directory disagree.
pub fn read(project: &Project) -> Result<Vec<Patch>> {
    let series_path = project.series_file();
    let series = fs::read_to_string(&series_path)
        .with_context(|| format!("cannot read {}", series_path.display()))?;
    let mut listed = BTreeSet::new();
    let mut patches = Vec::new();
    for line in series.lines() {
        let name = line.split('#').next().unwrap_or("").trim();
        if name.is_empty() {
            continue;
        }
        if name.contains('/') || !name.ends_with(".patch") {
            bail!("patches/series: `{name}` is not a file name ending in .patch");
        }
        if !listed.insert(name.to_owned()) {
            bail!("patches/series lists {name} twice");
        }
        let path = project.patches_dir().join(name);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "patches/series lists {name}, but {} cannot be read",
                path.display()
            )
        })?;
        patches.push(Patch {
            file: name.to_owned(),
            text,
        });
    }
    for entry in fs::read_dir(project.patches_dir())? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".patch") && !listed.contains(&name) {
            bail!("patches/{name} is not listed in patches/series (add it or delete it)");
        }
    }
    Ok(patches)
}

/// Renders `upstream..HEAD` of the driver repository as patches, deterministically: zeroed
/// `From` lines, no tool signature, full blob ids, and file names that are the subject's slug
/// (order belongs to `series`, not to names).
pub fn render(git: &Git, driver: &Path) -> Result<Vec<Patch>> {
    let out = tempfile::tempdir()?;
    let listing = git.run(
        driver,
        [
            "format-patch".as_ref(),
            "--zero-commit".as_ref(),
            "--no-signature".as_ref(),
            "--no-numbered".as_ref(),
            "--full-index".as_ref(),
            "--output-directory".as_ref(),
            out.path().as_os_str(),
            "upstream..HEAD".as_ref(),
        ],
    )?;
    let mut patches: Vec<Patch> = Vec::new();
    for generated in listing.lines().filter(|l| !l.trim().is_empty()) {
        let generated = Path::new(generated.trim());
        let path = out.path().join(
            generated
                .file_name()
                .context("format-patch printed no file name")?,
        );
        let text = fs::read_to_string(&path)?;
        let file = format!("{}.patch", slug(&subject(&text)));
        if let Some(twin) = patches.iter().find(|p| p.file == file) {
            bail!(
                "two commits in driver/ export to {file} (`{}` and `{}`); give them distinct subjects",
                subject(&twin.text),
                subject(&text)
            );
        }
        patches.push(Patch { file, text });
    }
    Ok(patches)
}

/// A file name for a subject: lower-case words joined by `-`, cut at a word boundary so names
/// stay readable in a listing.
pub fn slug(subject: &str) -> String {
    const MAX: usize = 64;
    let mut slug = String::new();
    // "upstream's" reads better as "upstreams" than as "upstream-s".
    let subject = subject.replace(['\'', '\u{2019}'], "");
    for word in subject
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !slug.is_empty() && slug.len() + 1 + word.len() > MAX {
            break;
        }
        if !slug.is_empty() {
            slug.push('-');
        }
        slug.push_str(&word.to_ascii_lowercase());
    }
    slug.truncate(MAX);
    if slug.is_empty() {
        slug.push_str("patch");
    }
    slug
}

/// The subject line of a mailbox patch, without the `[PATCH]` prefix.
pub fn subject(text: &str) -> String {
    let mut subject = String::new();
    let mut in_subject = false;
    for line in text.lines() {
        if in_subject {
            match line.strip_prefix(' ') {
                Some(more) => subject.push_str(&format!(" {more}")),
                None => break,
            }
        } else if let Some(s) = line.strip_prefix("Subject: ") {
            subject = s.to_owned();
            in_subject = true;
        } else if line.is_empty() {
            break;
        }
    }
    subject.trim_start_matches("[PATCH]").trim().to_owned()
}

/// The commit message body: after the mail headers, up to the `---` line before the diffstat.
fn body(text: &str) -> &str {
    let start = text.find("\n\n").map_or(text.len(), |i| i + 2);
    let rest = &text[start..];
    let end = rest
        .find("\n---\n")
        .map(|i| i + 1)
        .or_else(|| rest.starts_with("---\n").then_some(0))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The parts of a patch that matter when comparing an export with `patches/`: headers, message
/// and diff. The diffstat and any trailing signature depend on the git version that wrote the
/// file, so a patch written by another machine's git still counts as the same patch.
pub fn normalized(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_stat, mut in_diff) = (false, false);
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().copied().enumerate() {
        // format-patch's signature: "-- " then the git version, at the very end.
        let rest_is_signature = lines[i + 1..]
            .iter()
            .filter(|l| !l.trim().is_empty())
            .count()
            <= 1;
        if line == "-- " && rest_is_signature {
            break;
        }
        if !in_diff && !in_stat && line == "---" {
            in_stat = true;
        } else if line.starts_with("diff --git ") {
            in_stat = false;
            in_diff = true;
        } else if in_stat {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// What a patch message lacks. Empty when the message says what and why and ends with the
/// DEP-3-style fields (`Origin`, `Forwarded`, `Last-Update`, and `Bug` where it fixes one, as a
/// link to one of `defects`).
pub fn lint(patch: &Patch, defects: &DefectAnchors) -> Vec<String> {
    let mut problems = Vec::new();
    if subject(&patch.text).is_empty() {
        problems.push("no subject line".to_owned());
    }
    let body = body(&patch.text);
    let paragraphs: Vec<&str> = body
        .split("\n\n")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let is_field = |line: &str| {
        line.split_once(": ").is_some_and(|(key, _)| {
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
    };
    let (description, fields) = match paragraphs.split_last() {
        Some((last, rest)) if last.lines().all(is_field) => (rest, Some(*last)),
        _ => (&paragraphs[..], None),
    };
    let words: usize = description
        .iter()
        .map(|p| p.split_whitespace().count())
        .sum();
    if words < MIN_DESCRIPTION_WORDS {
        problems.push(format!(
            "the message does not say what the patch changes and why ({words} words before the \
             fields; write at least {MIN_DESCRIPTION_WORDS})"
        ));
    }
    let Some(fields) = fields else {
        problems.push(format!(
            "the message does not end with DEP-3 fields ({})",
            REQUIRED_FIELDS.join(", ")
        ));
        return problems;
    };
    let value_of = |key: &str| {
        fields
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(": ").map(str::trim))
    };
    for key in REQUIRED_FIELDS {
        match value_of(key) {
            None | Some("") => problems.push(format!("missing the `{key}:` field")),
            Some(value) => {
                if let Some(problem) = check_field(key, value) {
                    problems.push(problem);
                }
            }
        }
    }
    for line in fields.lines() {
        if let Some(value) = line.strip_prefix("Bug: ") {
            problems.extend(check_bug(value.trim(), defects));
        }
    }
    problems
}

/// A `Bug:` field is a link to a section of the defects document, so every reference resolves.
fn check_bug(value: &str, defects: &DefectAnchors) -> Option<String> {
    let link_prefix = format!("{DEFECTS_DOC}#");
    match value.strip_prefix(&link_prefix) {
        Some(anchor) if defects.contains(anchor) => None,
        Some(anchor) => Some(format!(
            "`Bug: {value}` links to an anchor {DEFECTS_DOC} does not define; add a section \
             there with `<a id=\"{anchor}\"></a>` before its heading"
        )),
        None => {
            // A bare ID such as `B2` was the old form; say what it should become.
            let id = value
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            Some(format!(
                "`Bug: {value}` must be a link to the defect's section, e.g. \
                 `Bug: {link_prefix}{id}`"
            ))
        }
    }
}

fn check_field(key: &str, value: &str) -> Option<String> {
    match key {
        "Forwarded" => {
            let ok = matches!(value, "no" | "not-needed" | "yes")
                || value.starts_with("https://")
                || value.starts_with("http://");
            (!ok).then(|| format!("`Forwarded: {value}` must be no, not-needed, yes or a link"))
        }
        "Last-Update" => {
            let parts: Vec<&str> = value.split('-').collect();
            let ok = matches!(parts.as_slice(), [y, m, d]
                if y.len() == 4 && m.len() == 2 && d.len() == 2
                    && [y, m, d].iter().all(|p| p.chars().all(|c| c.is_ascii_digit()))
                    && (1..=12).contains(&m.parse::<u32>().unwrap_or(0))
                    && (1..=31).contains(&d.parse::<u32>().unwrap_or(0)));
            (!ok).then(|| format!("`Last-Update: {value}` is not a YYYY-MM-DD date"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(message: &str) -> Patch {
        Patch {
            file: "x.patch".into(),
            text: format!(
                "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n\
                 From: Dev <dev@example.com>\nDate: Sun, 29 Nov 2026 20:00:00 +0000\n\
                 Subject: [PATCH] Identify the fork in the\n handshake\n\n{message}---\n \
                 src/lib.rs | 1 +\n\ndiff --git a/src/lib.rs b/src/lib.rs\n"
            ),
        }
    }

    const WHY: &str = "Server logs should show which driver build connects, so the handshake \
                       names the fork after upstream's driver name.\n\n";
    const FIELDS: &str = "Origin: vendor\nForwarded: not-needed\nLast-Update: 2026-11-29\n";

    #[test]
    fn normalized_ignores_diffstat_and_signature_only() {
        let a = patch(&format!("{WHY}{FIELDS}"));
        let other_git = a.text.replace(
            " src/lib.rs | 1 +\n",
            " src/lib.rs |  1 +\n 1 file changed\n",
        ) + "-- \n2.99.0\n";
        assert_eq!(normalized(&a.text), normalized(&other_git));
        let edited = a
            .text
            .replace("diff --git a/src/lib.rs", "diff --git a/src/main.rs");
        assert_ne!(normalized(&a.text), normalized(&edited));
    }

    #[test]
    fn slugs_are_lower_case_words_cut_at_a_boundary() {
        assert_eq!(
            slug("Fix B3: backoff overflow (saturate)"),
            "fix-b3-backoff-overflow-saturate"
        );
        let long = slug(
            "Build the driver as a workspace member without upstream's test tree and more words",
        );
        assert!(long.len() <= 64 && !long.ends_with('-'), "{long}");
        assert!(
            long.starts_with("build-the-driver-as-a-workspace-member-without-upstreams-"),
            "{long}"
        );
        assert_eq!(slug("!!!"), "patch");
    }

    #[test]
    fn folded_subject_is_joined() {
        assert_eq!(
            subject(&patch("").text),
            "Identify the fork in the handshake"
        );
    }

    /// The anchors of a defects document with sections B1 and B2.
    fn defects() -> DefectAnchors {
        DefectAnchors::parse(
            "# Defects\n\n<a id=\"b1\"></a>\n## B1: one\n\ntext\n\n<a id=\"b2\"></a>\n## B2: two\n",
        )
    }

    fn with_bug(value: &str) -> Patch {
        patch(&format!(
            "{WHY}Origin: vendor\nForwarded: no\nBug: {value}\nLast-Update: 2026-11-29\n"
        ))
    }

    #[test]
    fn complete_message_passes() {
        assert_eq!(
            lint(&patch(&format!("{WHY}{FIELDS}")), &defects()),
            Vec::<String>::new()
        );
        assert_eq!(
            lint(&with_bug("docs/defects.md#b2"), &defects()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn only_explicit_anchors_are_collected() {
        let anchors = DefectAnchors::parse(
            "<a id=\"b1\"></a>\n## B1: x\n## B3: a heading without an anchor\n\
             Write `<a id=\"bN\"></a>` before the heading.\n  <a id=\"f1\"></a>\n\
             <a id=\"\"></a>\n<a id=\"unterminated\n",
        );
        assert_eq!(
            anchors,
            DefectAnchors(["b1", "f1"].map(String::from).into_iter().collect())
        );
        assert_eq!(DefectAnchors::parse(""), DefectAnchors::default());
    }

    #[test]
    fn anchors_are_read_from_the_projects_defects_doc() {
        let root = tempfile::tempdir().unwrap();
        let project = Project::new(root.path());
        assert_eq!(
            DefectAnchors::read(&project).unwrap(),
            DefectAnchors::default(),
            "a project without the document defines no anchor"
        );
        fs::create_dir(root.path().join("docs")).unwrap();
        fs::write(
            root.path().join(DEFECTS_DOC),
            "<a id=\"b1\"></a>\n## B1: one\n<a id=\"b2\"></a>\n## B2: two\n",
        )
        .unwrap();
        assert_eq!(DefectAnchors::read(&project).unwrap(), defects());
    }

    #[test]
    fn bug_link_to_an_unknown_anchor_is_reported() {
        let problems = lint(&with_bug("docs/defects.md#b42"), &defects());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("does not define") && problems[0].contains(r#"<a id="b42">"#),
            "{problems:?}"
        );
        // Anchors are matched exactly: the heading's ID in upper case is not an anchor.
        assert_eq!(lint(&with_bug("docs/defects.md#B2"), &defects()).len(), 1);
        // A project without the document defines no anchor at all.
        assert_eq!(
            lint(&with_bug("docs/defects.md#b2"), &DefectAnchors::default()).len(),
            1
        );
    }

    #[test]
    fn bare_bug_id_is_reported_with_the_link_it_should_be() {
        let problems = lint(&with_bug("B2"), &defects());
        assert_eq!(
            problems,
            vec!["`Bug: B2` must be a link to the defect's section, e.g. \
                  `Bug: docs/defects.md#b2`"
                .to_owned()]
        );
        let problems = lint(&with_bug("B8 (found by a prose test)"), &defects());
        assert!(
            problems.len() == 1 && problems[0].contains("`Bug: docs/defects.md#b8`"),
            "{problems:?}"
        );
    }

    #[test]
    fn missing_why_is_reported() {
        let problems = lint(&patch(&format!("Fix it.\n\n{FIELDS}")), &defects());
        assert!(
            problems[0].contains("what the patch changes and why"),
            "{problems:?}"
        );
    }

    #[test]
    fn missing_or_malformed_fields_are_reported() {
        let problems = lint(&patch(WHY), &defects());
        assert!(
            problems.iter().any(|p| p.contains("DEP-3 fields")),
            "{problems:?}"
        );

        let partial = format!("{WHY}Origin: vendor\nLast-Update: 29/11/2026\n");
        let problems = lint(&patch(&partial), &defects());
        assert!(
            problems.iter().any(|p| p.contains("`Forwarded:`")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("YYYY-MM-DD")),
            "{problems:?}"
        );

        let bad_forward =
            format!("{WHY}Origin: vendor\nForwarded: maybe\nLast-Update: 2026-11-29\n");
        assert!(lint(&patch(&bad_forward), &defects())[0].contains("Forwarded: maybe"));
    }
}
