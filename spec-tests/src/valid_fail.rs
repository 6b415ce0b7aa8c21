//! The unified format's self-test: the `valid-fail` files hold valid tests that a conforming
//! runner MUST fail. Each case here passes only if the runner failed it, and failed it for the
//! reason the file describes: a case that starts passing, or fails for some other reason, is a
//! test failure. Cases that need something this runner does not support are skipped by the
//! usual plan, with its reason, and are never counted as having failed as required.

/// The suite's name in trial names and in the tally (`unified-test-format/valid-fail/...`),
/// kept apart from `valid-pass` so that a file stem used in both stays unique.
pub const SUITE_NAME: &str = "unified-test-format/valid-fail";

/// What the runner's failure must say, per file and (where the file's cases fail differently)
/// per case description: a case-insensitive substring of the failure message. Each names the
/// check the case exists to exercise, so that a case failing by accident (an unreachable target,
/// a typo in the runner) does not count.
const EXPECTED: &[(&str, Option<&str>, &str)] = &[
    (
        "assertNumberConnectionsCheckedOut",
        Some("operation fails if client field is not specified"),
        "missing argument `client`",
    ),
    (
        "assertNumberConnectionsCheckedOut",
        Some("operation fails if connections field is not specified"),
        "missing argument `connections`",
    ),
    (
        "assertNumberConnectionsCheckedOut",
        Some("operation fails if client entity does not exist"),
        "no entity named \"client1\"",
    ),
    (
        "assertNumberConnectionsCheckedOut",
        Some("operation fails if number of connections is incorrect"),
        "expected 1 connections checked out, found 0",
    ),
    ("entity-bucket-database-undefined", None, "no entity named"),
    (
        "entity-client-apiVersion-unsupported",
        None,
        "unknown serverApi version",
    ),
    (
        "entity-collection-database-undefined",
        None,
        "no entity named \"foo\"",
    ),
    (
        "entity-database-client-undefined",
        None,
        "no entity named \"foo\"",
    ),
    (
        "entity-findCursor-malformed",
        None,
        "missing argument `filter`",
    ),
    ("entity-findCursor", None, "no entity named \"cursor0\""),
    (
        "entity-session-client-undefined",
        None,
        "no entity named \"foo\"",
    ),
    (
        "ignoreResultAndError-malformed",
        None,
        "unknown argument for operation \"insertOne\"",
    ),
    ("ignoreResultAndError", None, "E11000 duplicate key"),
    // Client-side encryption cases: skipped (no csfle), listed so a future run checks them.
    (
        "kmsProviders-missing_aws_kms_credentials",
        None,
        "kmsProviders",
    ),
    (
        "kmsProviders-missing_azure_kms_credentials",
        None,
        "kmsProviders",
    ),
    (
        "kmsProviders-missing_gcp_kms_credentials",
        None,
        "kmsProviders",
    ),
    ("kmsProviders-no_kms", None, "kmsProviders"),
    (
        "operation-failure",
        Some("Unsupported command"),
        "CommandNotFound",
    ),
    (
        "operation-failure",
        Some("Unsupported query operator"),
        "unknown top level operator: $unsupportedQueryOperator",
    ),
    (
        "operation-unsupported",
        None,
        "unknown operation \"unsupportedOperation\"",
    ),
    (
        "operator-matchAsDocument",
        Some("matchAsDocument with non-matching filter"),
        "result mismatch at $[0].json.y: expected \"two\"",
    ),
    (
        "operator-matchAsDocument",
        Some("matchAsDocument evaluates special operators"),
        "result mismatch at $[0].json.y: expected the field to be absent",
    ),
    (
        "operator-matchAsDocument",
        Some("matchAsDocument does not permit extra fields"),
        "result mismatch at $[0].json.y: unexpected field in a nested document",
    ),
    // The scalar, array and malformed-JSON cases.
    (
        "operator-matchAsDocument",
        None,
        "$$matchAsDocument: not a JSON document",
    ),
    (
        "operator-matchAsRoot",
        None,
        "result mismatch at $[0].x.y: expected 3",
    ),
    (
        "returnDocument-enum-invalid",
        None,
        "Unknown return document value: invalid",
    ),
    (
        "schemaVersion-unsupported",
        None,
        "schemaVersion 0.1 is not supported",
    ),
];

/// The substring a failure of case `description` of file `stem` must contain. `None` for a file
/// this table does not know yet (a newer spec commit): any failure then counts, and the trial
/// says so.
pub fn expected_reason(stem: &str, description: &str) -> Option<&'static str> {
    let for_case = EXPECTED
        .iter()
        .find(|(s, d, _)| *s == stem && *d == Some(description));
    let for_file = EXPECTED.iter().find(|(s, d, _)| *s == stem && d.is_none());
    for_case.or(for_file).map(|(_, _, reason)| *reason)
}

/// How a `valid-fail` case went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The runner failed the case, for the expected reason (or the table has none).
    FailedAsRequired,
    /// The runner ran the case and it passed: the runner is too lenient.
    WronglyPassed,
    /// The runner failed the case, but not for the reason the file describes.
    FailedForAnotherReason { expected: String, message: String },
}

/// Judges a case from what the runner made of it.
pub fn judge(outcome: &Result<(), String>, expected: Option<&str>) -> Verdict {
    match (outcome, expected) {
        (Ok(()), _) => Verdict::WronglyPassed,
        (Err(_), None) => Verdict::FailedAsRequired,
        (Err(message), Some(reason)) => {
            if message.to_lowercase().contains(&reason.to_lowercase()) {
                Verdict::FailedAsRequired
            } else {
                Verdict::FailedForAnotherReason {
                    expected: reason.to_string(),
                    message: message.clone(),
                }
            }
        }
    }
}

/// The descriptions of a file's tests, read loosely (a file that fails strict loading still
/// names its cases, so each gets a trial of its own). Falls back to one unnamed case.
pub fn loose_descriptions(path: &std::path::Path) -> Vec<String> {
    let parsed: Option<serde_json::Value> = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    let names: Vec<String> = parsed
        .as_ref()
        .and_then(|v| v.get("tests"))
        .and_then(|t| t.as_array())
        .map(|tests| {
            tests
                .iter()
                .map(|t| {
                    t.get("description")
                        .and_then(|d| d.as_str())
                        .unwrap_or_default()
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        vec![String::new()]
    } else {
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_that_passes_is_a_failure_of_the_runner() {
        assert_eq!(judge(&Ok(()), Some("x")), Verdict::WronglyPassed);
        assert_eq!(judge(&Ok(()), None), Verdict::WronglyPassed);
    }

    #[test]
    fn the_failure_must_name_the_expected_reason() {
        let reason = expected_reason("schemaVersion-unsupported", "foo");
        assert_eq!(reason, Some("schemaVersion 0.1 is not supported"));
        let right = Err("cannot load the file: schemaVersion 0.1 is not supported".to_string());
        assert_eq!(judge(&right, reason), Verdict::FailedAsRequired);
        let wrong = Err("connection refused".to_string());
        assert!(matches!(
            judge(&wrong, reason),
            Verdict::FailedForAnotherReason { .. }
        ));
    }

    #[test]
    fn case_entries_win_over_file_entries() {
        assert_eq!(
            expected_reason(
                "assertNumberConnectionsCheckedOut",
                "operation fails if connections field is not specified"
            ),
            Some("missing argument `connections`")
        );
        assert_eq!(expected_reason("no-such-file", "x"), None);
    }
}
