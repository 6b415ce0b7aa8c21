//! Plans the cases of a file (what runs, what is skipped and why) and runs one case.

use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};

use crate::discovery::SpecFile;
use crate::entities::EntityMap;
use crate::expect;
use crate::matching::match_exact;
use crate::mongodb::options::{
    Acknowledgment, CreateCollectionOptions, ReadConcern, SelectionCriteria, WriteConcern,
};
use crate::mongodb::Client;
use crate::operations::{self, Ctx};
use crate::requirements;
use crate::schema::{self, TestFile, TopologyKind};
use crate::skips;
use crate::target::{self, Mode, Running};

/// A loaded file and the topology its cases run on.
pub struct LoadedFile {
    pub source: SpecFile,
    pub parsed: TestFile,
    /// The emulator topology chosen for the file (or the external target's).
    pub topology: Option<TopologyKind>,
    /// Per test: whether its emulator requires authentication (its requirements say
    /// `auth: true`); the runner's clients then log in as the emulator's user.
    pub auth: Vec<bool>,
}

/// One case: its trial name and, if it cannot run, why.
pub struct CasePlan {
    pub name: String,
    pub description: String,
    pub index: usize,
    pub skip: Option<String>,
}

/// Loads a file strictly (including every operation's arguments) and plans its cases.
pub fn plan_file(
    source: &SpecFile,
    mode: &Mode,
) -> Result<(Arc<LoadedFile>, Vec<CasePlan>), String> {
    let parsed = schema::load_file(&source.path).map_err(|e| e.to_string())?;
    let file_label = source.path.display().to_string();
    // Strict validation of operations, before deciding anything else.
    let buckets = operations::bucket_ids(&parsed);
    let mut op_skips = Vec::new();
    for (t, test) in parsed.tests.iter().enumerate() {
        let mut reason = None;
        for (o, op) in test.operations.iter().enumerate() {
            let path = format!("tests[{t}].operations[{o}]");
            let r = operations::validate(op, &path, &buckets)
                .map_err(|e| format!("{file_label}: at {e}"))?;
            reason = reason.or(r);
        }
        op_skips.push(reason);
    }
    let file_entity_skip = parsed
        .create_entities
        .as_deref()
        .and_then(operations::entities_skip_reason);

    let file_reqs = parsed.run_on_requirements.as_deref();
    let test_reqs: Vec<_> = parsed
        .tests
        .iter()
        .map(|t| t.run_on_requirements.as_deref())
        .collect();
    let (topology, base_info) = match mode {
        Mode::External { info, .. } => (Some(info.topology), info.clone()),
        Mode::Emulator => {
            let base = Mode::emulator_info(TopologyKind::ReplicaSet);
            let chosen =
                requirements::choose_topology(file_reqs, &test_reqs, &base, &preference()?);
            (chosen, base)
        }
    };
    let target_info = topology.map(|t| requirements::TargetInfo {
        topology: t,
        ..base_info
    });

    let spec_skip = skips::spec(&source.spec);
    let mut auth = Vec::new();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut cases = Vec::new();
    for (index, test) in parsed.tests.iter().enumerate() {
        let mut name = format!("{}/{}", source.name(), test.description);
        let n = seen.entry(name.clone()).or_insert(0);
        *n += 1;
        if *n > 1 {
            name = format!("{name} [{n}]");
        }
        // Whether the case runs against an emulator requiring authentication: only the
        // emulator can be started either way; an external target is what it is.
        let case_reqs = test.run_on_requirements.as_deref();
        let (requirements, needs_auth) = match (&target_info, mode) {
            (None, _) => (Ok(()), false),
            (Some(info), Mode::Emulator) => {
                match requirements::check_case_either_auth(file_reqs, case_reqs, info) {
                    Ok(auth) => (Ok(()), auth),
                    Err(reason) => (Err(reason), false),
                }
            }
            (Some(info), Mode::External { .. }) => (
                requirements::check_case(file_reqs, case_reqs, info),
                info.auth,
            ),
        };
        auth.push(needs_auth);
        // A case listed by name is a deliberate decision about that case (or file), so its
        // reason wins over any reason found in the case's contents.
        let skip = if let Some(reason) = spec_skip {
            Some(reason.to_string())
        } else if let Some(reason) = skips::skipped_case(&name) {
            Some(reason.to_string())
        } else if let Some(reason) = &test.skip_reason {
            Some(format!("skipReason in the file: {reason}"))
        } else if let Some(reason) = &file_entity_skip {
            Some(reason.clone())
        } else if let Some(reason) = &op_skips[index] {
            Some(reason.clone())
        } else {
            match &target_info {
                None => Some(match mode {
                    Mode::Emulator => {
                        let rs = Mode::emulator_info(TopologyKind::ReplicaSet);
                        let why = requirements::check(file_reqs, &rs)
                            .and_then(|()| {
                                requirements::check(test.run_on_requirements.as_deref(), &rs)
                            })
                            .err()
                            .unwrap_or_else(|| "no test of the file can run".to_string());
                        format!("no emulator topology satisfies the requirements: {why}")
                    }
                    Mode::External { .. } => "runOnRequirements not met".to_string(),
                }),
                Some(_) => requirements.err(),
            }
        };
        let skip = skip
            .or_else(|| skips::known_failure(&name).map(|r| format!("known failure: {r}")))
            .or_else(|| {
                (matches!(mode, Mode::Emulator) && !target::emulator_available())
                    .then(|| skips::NO_TARGET.to_string())
            });
        cases.push(CasePlan {
            name,
            description: test.description.clone(),
            index,
            skip,
        });
    }
    Ok((
        Arc::new(LoadedFile {
            source: source.clone(),
            parsed,
            topology,
            auth,
        }),
        cases,
    ))
}

/// The emulator topology preference: `SPEC_TOPOLOGY` (single, replicaset or sharded) first when
/// set, to exercise another persona, then the default order.
fn preference() -> Result<Vec<TopologyKind>, String> {
    let mut order = requirements::TOPOLOGY_PREFERENCE.to_vec();
    if let Ok(wanted) = std::env::var("SPEC_TOPOLOGY") {
        let first = match wanted.as_str() {
            "" => return Ok(order),
            "single" => TopologyKind::Single,
            "replicaset" => TopologyKind::ReplicaSet,
            "sharded" => TopologyKind::Sharded,
            other => {
                return Err(format!(
                    "SPEC_TOPOLOGY={other:?}: expected single, replicaset or sharded"
                ))
            }
        };
        order.retain(|t| *t != first);
        order.insert(0, first);
    }
    Ok(order)
}

/// How long one case may take before it fails.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs one case: starts its target, runs it, shuts the target down.
pub async fn run_case(file: &LoadedFile, index: usize, mode: &Mode) -> Result<(), String> {
    let topology = file
        .topology
        .ok_or("no topology satisfies the file's requirements")?;
    let auth = file.auth.get(index).copied().unwrap_or(false);
    let running = target::start(mode, topology, auth).await?;
    let result =
        match tokio::time::timeout(CASE_TIMEOUT, run_test(&file.parsed, index, &running)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the test did not finish in {} s",
                CASE_TIMEOUT.as_secs()
            )),
        };
    running.shutdown().await;
    result
}

fn majority() -> WriteConcern {
    WriteConcern::builder().w(Acknowledgment::Majority).build()
}

async fn load_initial_data(
    internal: &Client,
    data: &[schema::CollectionData],
) -> Result<(), String> {
    for d in data {
        let db = internal.database(&d.database_name);
        let coll = db.collection::<Document>(&d.collection_name);
        coll.drop().write_concern(majority()).await.map_err(|e| {
            format!(
                "initialData: dropping {}.{}: {e}",
                d.database_name, d.collection_name
            )
        })?;
        let mut options: CreateCollectionOptions = match &d.create_options {
            Some(o) => bson::from_document(o.clone())
                .map_err(|e| format!("initialData: createOptions {o}: {e}"))?,
            None => CreateCollectionOptions::default(),
        };
        options.write_concern = Some(majority());
        db.create_collection(&d.collection_name)
            .with_options(options)
            .await
            .map_err(|e| {
                format!(
                    "initialData: creating {}.{}: {e}",
                    d.database_name, d.collection_name
                )
            })?;
        if !d.documents.is_empty() {
            coll.insert_many(d.documents.clone())
                .write_concern(majority())
                .await
                .map_err(|e| {
                    format!(
                        "initialData: inserting into {}.{}: {e}",
                        d.database_name, d.collection_name
                    )
                })?;
        }
    }
    Ok(())
}

async fn check_outcome(
    internal: &Client,
    outcome: &[schema::CollectionData],
) -> Result<(), String> {
    for o in outcome {
        let coll = internal
            .database(&o.database_name)
            .collection::<Document>(&o.collection_name);
        let mut cursor = coll
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .selection_criteria(SelectionCriteria::ReadPreference(
                crate::mongodb::options::ReadPreference::Primary,
            ))
            .read_concern(ReadConcern::local())
            .await
            .map_err(|e| {
                format!(
                    "outcome: reading {}.{}: {e}",
                    o.database_name, o.collection_name
                )
            })?;
        let mut actual = Vec::new();
        while cursor.advance().await.map_err(|e| {
            format!(
                "outcome: reading {}.{}: {e}",
                o.database_name, o.collection_name
            )
        })? {
            let doc: Document = cursor.deserialize_current().map_err(|e| e.to_string())?;
            actual.push(Bson::Document(doc));
        }
        let expected = Bson::Array(o.documents.iter().cloned().map(Bson::Document).collect());
        // Exact, not the evaluating matcher: the format says collection data "MUST match
        // exactly", so a driver that wrote an int64 where the test wrote an int32 fails here.
        match_exact(&expected, &Bson::Array(actual.clone())).map_err(|m| {
            format!(
                "outcome of {}.{} {m}; the collection holds {}",
                o.database_name,
                o.collection_name,
                Bson::Array(actual)
            )
        })?;
    }
    Ok(())
}

async fn run_operations(ctx: &mut Ctx, test: &schema::Test, file: &TestFile) -> Result<(), String> {
    if let Some(defs) = &file.create_entities {
        operations::create_entities(ctx, defs)
            .await
            .map_err(|e| format!("createEntities: {e}"))?;
    }
    for (i, op) in test.operations.iter().enumerate() {
        let label = format!("operations[{i}] ({} on {})", op.name, op.object);
        let result = operations::execute(ctx, op, None)
            .await
            .map_err(|e| format!("{label}: {e}"))?;
        if let Some(failure) = ctx.callback_failures.first() {
            return Err(format!("{label}: in the callback: {failure}"));
        }
        expect::check_operation(op, result, &mut ctx.entities)
            .map_err(|e| format!("{label}: {e}"))?;
    }
    // A thread whose failure no `waitForThread` reported still fails the test: the format says
    // a failed assertion on a thread fails the whole case.
    operations::join_threads(&ctx.entities, "at the end of the test").await?;
    if let Some(expected) = &test.expect_events {
        // Events may still be in flight (e.g. a killCursors after close); give them a moment.
        tokio::time::sleep(Duration::from_millis(50)).await;
        expect::check_events(expected, &ctx.entities).map_err(|e| format!("expectEvents: {e}"))?;
    }
    if let Some(expected) = &test.expect_log_messages {
        check_log_messages(expected, &ctx.entities)?;
    }
    Ok(())
}

/// `expectLogMessages`: each client's captured messages against its expectations.
fn check_log_messages(
    expected: &[crate::logs::ExpectedLogMessagesForClient],
    entities: &EntityMap,
) -> Result<(), String> {
    for want in expected {
        let client = entities
            .client(&want.client)
            .map_err(|e| format!("expectLogMessages: {e}"))?;
        let Some(collector) = &client.logs else {
            return Err(format!(
                "expectLogMessages: client {} has no observeLogMessages",
                want.client
            ));
        };
        crate::logs::check(want, &collector.messages(), entities)
            .map_err(|e| format!("expectLogMessages: {e}"))?;
    }
    Ok(())
}

/// Runs test `index` of `file` against a running target.
pub async fn run_test(file: &TestFile, index: usize, target: &Running) -> Result<(), String> {
    let test = file
        .tests
        .get(index)
        .ok_or_else(|| format!("no test at index {index}"))?;
    let internal = Client::with_uri_str(&target.uri)
        .await
        .map_err(|e| format!("internal client for {}: {e}", target.uri))?;
    if let Some(data) = &file.initial_data {
        load_initial_data(&internal, data).await?;
    }
    let mut ctx = Ctx {
        entities: EntityMap::default(),
        uri: target.uri.clone(),
        single_host: target.multiple_routers,
        internal: internal.clone(),
        failpoints: Vec::new(),
        callback_failures: Vec::new(),
    };
    let result = run_operations(&mut ctx, test, file).await;
    // Clean up whatever happened: fail points off, sessions ended, clients dropped.
    for (client, name) in ctx.failpoints.drain(..) {
        let _ = client
            .database("admin")
            .run_command(doc! {"configureFailPoint": name, "mode": "off"})
            .await;
    }
    // Shut clients down while the runtime is alive (ends their sessions, closes their pools),
    // rather than leaving it to drop handlers racing the runtime's end.
    let clients = ctx.entities.clients();
    ctx.entities.clear();
    for entity in clients {
        let shutdown = entity.client.shutdown().immediate(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), shutdown).await;
    }
    result?;
    let outcome = match &test.outcome {
        Some(outcome) => check_outcome(&internal, outcome).await,
        None => Ok(()),
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), internal.shutdown().immediate(true)).await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Result<Vec<CasePlan>, String> {
        let dir = std::env::temp_dir().join(format!("spec-runner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let path = dir.join(format!("f{}.json", json.len()));
        std::fs::write(&path, json).map_err(|e| e.to_string())?;
        let source = SpecFile {
            spec: "demo".into(),
            stem: "f".into(),
            path: path.clone(),
        };
        let result = plan_file(&source, &Mode::Emulator).map(|(_, cases)| cases);
        let _ = std::fs::remove_file(&path);
        result
    }

    const HEAD: &str = r#"{"description": "d", "schemaVersion": "1.3",
        "createEntities": [{"client": {"id": "c"}}, {"database": {"id": "db", "client": "c",
        "databaseName": "x"}}, {"collection": {"id": "coll", "database": "db",
        "collectionName": "y"}}], "tests": ["#;

    #[test]
    fn unsupported_operations_skip_with_their_reason() {
        let cases = plan(&format!(
            r#"{HEAD} {{"description": "a", "operations": [{{"name": "count", "object": "coll",
                "arguments": {{"filter": {{}}}}}}]}},
               {{"description": "a", "operations": []}}]}}"#
        ))
        .unwrap();
        assert_eq!(cases[0].name, "demo/f/a");
        assert!(cases[0]
            .skip
            .as_deref()
            .unwrap()
            .contains("no deprecated count"));
        // Duplicate descriptions get a suffix so every trial name is unique.
        assert_eq!(cases[1].name, "demo/f/a [2]");
    }

    #[test]
    fn an_unknown_argument_is_a_load_error_with_its_path() {
        let err = plan(&format!(
            r#"{HEAD} {{"description": "a", "operations": [{{"name": "find", "object": "coll",
                "arguments": {{"filtre": {{}}}}}}]}}]}}"#
        ))
        .err()
        .unwrap();
        assert!(
            err.contains("tests[0].operations[0].arguments.filtre"),
            "{err}"
        );
    }

    #[test]
    fn requirements_no_emulator_topology_can_meet_are_skips() {
        let cases = plan(&format!(
            r#"{HEAD} {{"description": "a", "runOnRequirements": [{{"topologies": ["load-balanced"]}}],
                "operations": []}}]}}"#
        ))
        .unwrap();
        assert!(
            cases[0].skip.as_deref().unwrap().contains("load-balanced"),
            "{:?}",
            cases[0].skip
        );
    }
}
