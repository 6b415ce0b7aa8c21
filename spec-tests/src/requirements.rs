//! `runOnRequirements`: whether a file or a test can run on a target, and which emulator
//! topology to start so that it can.

use bson::Document;

use crate::matching::numbers_equal;
use crate::schema::{CsfleRequirement, RunOnRequirement, ServerlessRequirement, TopologyKind};

/// What the requirements are checked against: the emulator's configuration, or the real
/// deployment's `buildInfo`/`hello`/`getParameter`.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    pub version: (u32, u32, u32),
    pub topology: TopologyKind,
    pub serverless: bool,
    pub auth: bool,
    /// `getParameter: "*"`; `None` when the target cannot report it.
    pub server_parameters: Option<Document>,
}

/// Parses `"4.1.7"`, `"8.0"` or `"4.2.99"`; missing parts are 0.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text
        .split(['.', '-'])
        .take(3)
        .map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    Some((major, minor, patch))
}

fn same_topology(wanted: TopologyKind, actual: TopologyKind) -> bool {
    let norm = |t| match t {
        TopologyKind::ShardedReplicaSet => TopologyKind::Sharded,
        t => t,
    };
    norm(wanted) == norm(actual)
}

/// Why one requirement is not met, or `Ok` when it is.
pub fn check_one(req: &RunOnRequirement, target: &TargetInfo) -> Result<(), String> {
    if let Some(min) = &req.min_server_version {
        let v = parse_version(min).ok_or_else(|| format!("bad minServerVersion {min:?}"))?;
        if target.version < v {
            return Err(format!("needs server >= {min}"));
        }
    }
    if let Some(max) = &req.max_server_version {
        let v = parse_version(max).ok_or_else(|| format!("bad maxServerVersion {max:?}"))?;
        if target.version > v {
            return Err(format!("needs server <= {max}"));
        }
    }
    if let Some(tops) = &req.topologies {
        if !tops.iter().any(|t| same_topology(*t, target.topology)) {
            let names: Vec<_> = tops.iter().map(ToString::to_string).collect();
            return Err(format!("needs topology {}", names.join("|")));
        }
    }
    match (req.serverless, target.serverless) {
        (Some(ServerlessRequirement::Require), false) => return Err("needs serverless".into()),
        (Some(ServerlessRequirement::Forbid), true) => return Err("forbids serverless".into()),
        _ => {}
    }
    if let Some(auth) = req.auth {
        if auth != target.auth {
            return Err(if auth {
                "needs auth"
            } else {
                "needs auth disabled"
            }
            .into());
        }
    }
    if req.auth_mechanism.is_some() {
        return Err("needs a specific auth mechanism".into());
    }
    match &req.csfle {
        Some(CsfleRequirement::Flag(false)) | None => {}
        Some(_) => return Err("needs client-side field level encryption".into()),
    }
    if let Some(params) = &req.server_parameters {
        let Some(actual) = &target.server_parameters else {
            return Err("needs serverParameters the target does not report".into());
        };
        for (key, want) in params {
            let have = actual.get(key);
            let ok = match have {
                Some(have) => numbers_equal(want, have).unwrap_or_else(|| want == have),
                None => false,
            };
            if !ok {
                return Err(format!("needs server parameter {key}={want}"));
            }
        }
    }
    Ok(())
}

/// `Ok` when any requirement is met (or there are none); otherwise the reasons, joined.
pub fn check(reqs: Option<&[RunOnRequirement]>, target: &TargetInfo) -> Result<(), String> {
    let Some(reqs) = reqs.filter(|r| !r.is_empty()) else {
        return Ok(());
    };
    let mut reasons = Vec::new();
    for req in reqs {
        match check_one(req, target) {
            Ok(()) => return Ok(()),
            Err(reason) => reasons.push(reason),
        }
    }
    reasons.dedup();
    Err(format!(
        "runOnRequirements not met: {}",
        reasons.join("; or ")
    ))
}

/// The default preference: replica set (transactions need it), then sharded, then single.
pub const TOPOLOGY_PREFERENCE: [TopologyKind; 3] = [
    TopologyKind::ReplicaSet,
    TopologyKind::Sharded,
    TopologyKind::Single,
];

/// Whether the file's and the test's requirements are met by `target`.
pub fn check_case(
    file_reqs: Option<&[RunOnRequirement]>,
    test_reqs: Option<&[RunOnRequirement]>,
    target: &TargetInfo,
) -> Result<(), String> {
    check(file_reqs, target).and_then(|()| check(test_reqs, target))
}

/// How a case runs on a target that can be started with or without authentication (the
/// emulator): on `base` (authentication off) when that meets its requirements, else with
/// authentication on when that does; otherwise the reasons `base` does not meet them.
pub fn check_case_either_auth(
    file_reqs: Option<&[RunOnRequirement]>,
    test_reqs: Option<&[RunOnRequirement]>,
    base: &TargetInfo,
) -> Result<bool, String> {
    match check_case(file_reqs, test_reqs, base) {
        Ok(()) => Ok(base.auth),
        Err(reason) => {
            let other = TargetInfo {
                auth: !base.auth,
                ..base.clone()
            };
            check_case(file_reqs, test_reqs, &other)
                .map(|()| other.auth)
                .map_err(|_| reason)
        }
    }
}

/// The emulator topology to start for a file and its tests: the first of `preference` that
/// satisfies the file's requirements and those of at least one test, preferring the one that
/// satisfies the most tests. The emulator runs with or without authentication, so a case counts
/// when either meets its requirements.
pub fn choose_topology(
    file_reqs: Option<&[RunOnRequirement]>,
    test_reqs: &[Option<&[RunOnRequirement]>],
    base: &TargetInfo,
    preference: &[TopologyKind],
) -> Option<TopologyKind> {
    let mut best: Option<(TopologyKind, usize)> = None;
    for &topology in preference {
        let target = TargetInfo {
            topology,
            ..base.clone()
        };
        let runnable = test_reqs
            .iter()
            .filter(|r| check_case_either_auth(file_reqs, **r, &target).is_ok())
            .count();
        if runnable > 0 && best.is_none_or(|(_, n)| runnable > n) {
            best = Some((topology, runnable));
        }
    }
    best.map(|(t, _)| t)
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn target(topology: TopologyKind) -> TargetInfo {
        TargetInfo {
            version: (8, 0, 0),
            topology,
            serverless: false,
            auth: false,
            server_parameters: Some(doc! {"enableTestCommands": 1}),
        }
    }

    fn req(json: &str) -> RunOnRequirement {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn versions() {
        assert_eq!(parse_version("4.2.99"), Some((4, 2, 99)));
        assert_eq!(parse_version("8.0"), Some((8, 0, 0)));
        assert_eq!(parse_version("7.0.0-rc1"), Some((7, 0, 0)));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn any_requirement_suffices() {
        let reqs = [
            req(r#"{"minServerVersion": "9.0"}"#),
            req(r#"{"topologies": ["replicaset"], "serverless": "forbid"}"#),
        ];
        assert!(check(Some(&reqs), &target(TopologyKind::ReplicaSet)).is_ok());
        let err = check(Some(&reqs), &target(TopologyKind::Single)).unwrap_err();
        assert!(err.contains("needs server >= 9.0"), "{err}");
        assert!(err.contains("needs topology replicaset"), "{err}");
    }

    #[test]
    fn max_version_auth_and_parameters() {
        let t = target(TopologyKind::Single);
        assert!(check_one(&req(r#"{"maxServerVersion": "4.2.99"}"#), &t).is_err());
        assert!(check_one(&req(r#"{"auth": true}"#), &t).is_err());
        assert!(check_one(&req(r#"{"csfle": true}"#), &t).is_err());
        assert!(check_one(
            &req(r#"{"serverParameters": {"enableTestCommands": true}}"#),
            &t
        )
        .is_err());
        assert!(check_one(
            &req(r#"{"serverParameters": {"enableTestCommands": 1.0}}"#),
            &t
        )
        .is_ok());
    }

    #[test]
    fn auth_cases_run_with_authentication_and_the_others_without() {
        let t = target(TopologyKind::ReplicaSet);
        let auth = [req(r#"{"auth": true}"#)];
        let no_auth = [req(r#"{"auth": false}"#)];
        assert_eq!(check_case_either_auth(None, Some(&auth), &t), Ok(true));
        assert_eq!(check_case_either_auth(Some(&auth), None, &t), Ok(true));
        assert_eq!(check_case_either_auth(None, Some(&no_auth), &t), Ok(false));
        assert_eq!(check_case_either_auth(None, None, &t), Ok(false));
        // A case whose requirements fail for another reason keeps that reason.
        let later = [req(r#"{"auth": true, "minServerVersion": "99.0"}"#)];
        let err = check_case_either_auth(None, Some(&later), &t).unwrap_err();
        assert!(err.contains("needs server >= 99.0"), "{err}");
        // Contradictory file and test requirements cannot run.
        assert!(check_case_either_auth(Some(&auth), Some(&no_auth), &t).is_err());
        // A file that needs auth still gets a topology.
        let rs_auth = [req(
            r#"{"topologies": ["replicaset", "sharded"], "auth": true}"#,
        )];
        assert_eq!(
            choose_topology(Some(&rs_auth), &[None], &t, &TOPOLOGY_PREFERENCE),
            Some(TopologyKind::ReplicaSet)
        );
    }

    #[test]
    fn topology_choice_prefers_replica_sets_then_sharded() {
        let base = target(TopologyKind::Single);
        let any = [req(r#"{"minServerVersion": "4.0"}"#)];
        assert_eq!(
            choose_topology(Some(&any), &[None], &base, &TOPOLOGY_PREFERENCE),
            Some(TopologyKind::ReplicaSet)
        );
        let sharded = [req(r#"{"topologies": ["single", "sharded"]}"#)];
        assert_eq!(
            choose_topology(Some(&sharded), &[None], &base, &TOPOLOGY_PREFERENCE),
            Some(TopologyKind::Sharded)
        );
        let lb = [req(r#"{"topologies": ["load-balanced"]}"#)];
        assert_eq!(
            choose_topology(Some(&lb), &[None], &base, &TOPOLOGY_PREFERENCE),
            None
        );
        let sharded_first = [TopologyKind::Sharded, TopologyKind::ReplicaSet];
        assert_eq!(
            choose_topology(Some(&any), &[None], &base, &sharded_first),
            Some(TopologyKind::Sharded)
        );
        let single_tests = [req(r#"{"topologies": ["single"]}"#)];
        assert_eq!(
            choose_topology(
                None,
                &[Some(&single_tests), Some(&single_tests)],
                &base,
                &TOPOLOGY_PREFERENCE
            ),
            Some(TopologyKind::Single)
        );
    }
}
