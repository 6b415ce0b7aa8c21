//! Commands behind mongosh's helpers that a new user tries first: `rs.status()`
//! (`replSetGetStatus`) and `db.c.find().explain()` (`explain`), over raw wire-protocol
//! connections, with mongod's reply shapes and errors.

mod common;

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use common::RawClient;
use emulator::{StepDown, Topology};

async fn admin(addr: std::net::SocketAddr, body: Document) -> Document {
    let mut body = body;
    body.insert("$db", "admin");
    RawClient::connect(addr)
        .await
        .command(&body)
        .await
        .expect("a reply")
}

fn states(status: &Document) -> Vec<(String, i32, String, bool)> {
    status
        .get_array("members")
        .expect("members")
        .iter()
        .map(|m| {
            let m = m.as_document().expect("member document");
            (
                m.get_str("name").unwrap().to_owned(),
                m.get_i32("state").unwrap(),
                m.get_str("stateStr").unwrap().to_owned(),
                m.get_bool("self").unwrap_or(false),
            )
        })
        .collect()
}

#[tokio::test]
async fn repl_set_get_status_reports_every_member_and_follows_elections() {
    let emu = common::start(common::rs(3)).await;
    let addrs = emu.addresses();
    let status = admin(addrs[1], doc! { "replSetGetStatus": 1 }).await;
    assert_eq!(status.get_f64("ok"), Ok(1.0), "{status}");
    assert_eq!(status.get_str("set"), Ok("rs0"));
    assert_eq!(
        status.get_i32("myState"),
        Ok(2),
        "member 1 is a secondary: {status}"
    );
    assert_eq!(status.get_i64("term"), Ok(1));
    assert!(
        matches!(status.get("date"), Some(Bson::DateTime(_))),
        "{status}"
    );
    let members = states(&status);
    assert_eq!(members.len(), 3);
    assert_eq!(members[0].1, 1);
    assert_eq!(members[0].2, "PRIMARY");
    assert_eq!(
        (members[1].1, members[1].2.as_str(), members[1].3),
        (2, "SECONDARY", true)
    );
    assert!(
        !members[0].3 && !members[2].3,
        "only the answering member is self"
    );
    let hello = admin(addrs[0], doc! { "hello": 1 }).await;
    let hosts: Vec<&str> = hello
        .get_array("hosts")
        .unwrap()
        .iter()
        .filter_map(Bson::as_str)
        .collect();
    let names: Vec<&str> = members.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(names, hosts, "the members are hello's hosts");

    emu.step_down(&StepDown::default()).expect("steps down");
    let deadline = Instant::now() + Duration::from_secs(5);
    let new_primary = loop {
        if let Some(p) = emu.primary().filter(|p| *p != 0) {
            break p;
        }
        assert!(Instant::now() < deadline, "no new primary within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = admin(addrs[new_primary], doc! { "replSetGetStatus": 1 }).await;
    assert_eq!(status.get_i32("myState"), Ok(1), "{status}");
    assert_eq!(status.get_i64("term"), Ok(2), "{status}");
    let members = states(&status);
    assert_eq!(members[0].2, "SECONDARY");
    assert_eq!(members[new_primary].2, "PRIMARY");
}

#[tokio::test]
async fn repl_set_get_status_refuses_where_mongod_does() {
    let emu = common::start(Topology::Standalone).await;
    let reply = admin(emu.addresses()[0], doc! { "replSetGetStatus": 1 }).await;
    assert_eq!(reply.get_f64("ok"), Ok(0.0), "{reply}");
    assert_eq!(
        reply.get_i32("code"),
        Ok(76),
        "NoReplicationEnabled: {reply}"
    );
    assert_eq!(reply.get_str("errmsg"), Ok("not running with --replSet"));

    let emu = common::start(common::rs(1)).await;
    let mut c = RawClient::connect(emu.addresses()[0]).await;
    let reply = c
        .command(&doc! { "replSetGetStatus": 1, "$db": "test" })
        .await
        .unwrap();
    assert_eq!(reply.get_i32("code"), Ok(13), "admin only: {reply}");

    let emu = common::start(Topology::Sharded { routers: 1 }).await;
    let reply = admin(emu.addresses()[0], doc! { "replSetGetStatus": 1 }).await;
    assert_eq!(
        reply.get_i32("code"),
        Ok(59),
        "mongos has no such command: {reply}"
    );
}

#[tokio::test]
async fn explain_reports_a_collection_scan_and_counts_what_the_find_returns() {
    let emu = common::start(common::rs(3)).await;
    let addrs = emu.addresses();
    let mut c = RawClient::connect(addrs[0]).await;
    let insert = c
        .command(&doc! {
            "insert": "c",
            "documents": [{ "_id": 1, "x": 1 }, { "_id": 2, "x": 2 }, { "_id": 3, "x": 2 }],
            "$db": "test",
        })
        .await
        .unwrap();
    assert_eq!(insert.get_i32("n"), Ok(3), "{insert}");

    // What mongosh sends for `db.c.find({x: 2}).explain()`.
    let plan = c
        .command(&doc! {
            "explain": { "find": "c", "filter": { "x": 2 } },
            "verbosity": "queryPlanner",
            "$db": "test",
        })
        .await
        .unwrap();
    assert_eq!(plan.get_f64("ok"), Ok(1.0), "{plan}");
    assert_eq!(plan.get_str("explainVersion"), Ok("1"));
    let planner = plan.get_document("queryPlanner").unwrap();
    assert_eq!(planner.get_str("namespace"), Ok("test.c"));
    assert_eq!(planner.get_document("parsedQuery"), Ok(&doc! { "x": 2 }));
    let winning = planner.get_document("winningPlan").unwrap();
    assert_eq!(winning.get_str("stage"), Ok("COLLSCAN"));
    assert_eq!(winning.get_document("filter"), Ok(&doc! { "x": 2 }));
    assert!(
        plan.get("executionStats").is_none(),
        "queryPlanner only: {plan}"
    );
    assert_eq!(
        plan.get_document("command").unwrap().get_str("find"),
        Ok("c")
    );

    let stats = c
        .command(&doc! {
            "explain": { "find": "c", "filter": { "x": 2 } },
            "verbosity": "executionStats",
            "$db": "test",
        })
        .await
        .unwrap();
    let stats = stats
        .get_document("executionStats")
        .expect("executionStats");
    assert_eq!(stats.get_i64("nReturned"), Ok(2), "{stats}");
    assert_eq!(stats.get_i64("totalDocsExamined"), Ok(3), "{stats}");

    // Nothing ran: explain of a delete leaves the documents in place.
    let plan = c
        .command(&doc! {
            "explain": { "delete": "c", "deletes": [{ "q": { "x": 2 }, "limit": 0 }] },
            "$db": "test",
        })
        .await
        .unwrap();
    assert_eq!(plan.get_f64("ok"), Ok(1.0), "{plan}");
    let count = c
        .command(&doc! { "count": "c", "$db": "test" })
        .await
        .unwrap();
    assert_eq!(
        count
            .get_i32("n")
            .ok()
            .map(i64::from)
            .or(count.get_i64("n").ok()),
        Some(3)
    );

    let unknown = c
        .command(&doc! { "explain": { "ping": 1 }, "$db": "test" })
        .await
        .unwrap();
    assert_eq!(unknown.get_i32("code"), Ok(59), "{unknown}");
    let bad = c
        .command(&doc! { "explain": { "find": "c" }, "verbosity": "loud", "$db": "test" })
        .await
        .unwrap();
    assert_eq!(bad.get_i32("code"), Ok(2), "BadValue: {bad}");

    // A secondary explains only with secondaryOk, like any read.
    let mut secondary = RawClient::connect(addrs[1]).await;
    let refused = secondary
        .command(&doc! { "explain": { "find": "c" }, "$db": "test" })
        .await
        .unwrap();
    assert_eq!(refused.get_i32("code"), Ok(13435), "{refused}");
}
