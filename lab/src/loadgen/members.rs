//! Direct connections to each member of the emulator's deployment, beside the drivers under
//! test: the members' addresses from the connection string, their connection-drop fail points,
//! and step-downs (the lab's faults and the soak's, and the control connection's per-router
//! parameters).

use std::time::Duration;

use bson::{doc, Document};
use tokio::time::Instant;

/// How long a stepped-down primary cannot be elected again: short, so that frequent
/// step-downs (the test's every 3 s) always find another electable member.
const STEP_DOWN_FOR_SECS: i64 = 1;
/// How long the set is without a primary after each step-down.
const ELECTION_DELAY_MS: i64 = 300;

/// The members' addresses, from the emulator's connection string.
pub(crate) fn member_hosts(uri: &str) -> Vec<String> {
    let rest = uri.strip_prefix("mongodb://").unwrap_or(uri);
    let hosts = rest.split('/').next().unwrap_or_default();
    hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect()
}

/// Which connections the members close: before a share of some commands, and after a share of
/// the writes they applied (the reply lost).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Drops {
    /// Share of `before_commands` whose connection is closed before they run.
    pub(crate) before_share: f64,
    /// The commands `failCommand` closes the connection before.
    pub(crate) before_commands: &'static [&'static str],
    /// Share of applied writes whose connection is closed before the reply.
    pub(crate) after_share: f64,
}

/// A direct connection to each member, for its fail points and for finding the primary.
pub(crate) struct Members {
    clients: Vec<mongodb::Client>,
}

impl Members {
    pub(crate) async fn connect(uri: &str) -> Result<Members, String> {
        let mut clients = Vec::new();
        for host in member_hosts(uri) {
            let c = mongodb::Client::with_uri_str(format!(
                "mongodb://{host}/?directConnection=true&appName=lab-soak-admin"
            ))
            .await
            .map_err(|e| format!("{host}: {e}"))?;
            clients.push(c);
        }
        Ok(Members { clients })
    }

    /// Runs `cmd` on one member's `admin` database.
    pub(crate) async fn admin(c: &mongodb::Client, cmd: Document) -> Result<Document, String> {
        c.database("admin")
            .run_command(cmd)
            .await
            .map_err(|e| e.to_string())
    }

    /// Switches the connection drops `drops` on (or, with `None`, off) on every member.
    pub(crate) async fn set_drops(&self, drops: Option<&Drops>) -> Result<(), String> {
        for c in &self.clients {
            let (before, after) = if let Some(d) = drops {
                (
                    doc! {
                        "configureFailPoint": "failCommand",
                        "mode": { "activationProbability": d.before_share },
                        "data": {
                            "failCommands": d.before_commands,
                            "closeConnection": true,
                        },
                    },
                    doc! {
                        "configureFailPoint": "onPrimaryTransactionalWrite",
                        "mode": { "activationProbability": d.after_share },
                        "data": { "closeConnection": true },
                    },
                )
            } else {
                (
                    doc! { "configureFailPoint": "failCommand", "mode": "off" },
                    doc! { "configureFailPoint": "onPrimaryTransactionalWrite", "mode": "off" },
                )
            };
            Members::admin(c, before).await?;
            Members::admin(c, after).await?;
        }
        Ok(())
    }

    /// Steps the current primary down; `Ok(false)` when no member is primary right now.
    pub(crate) async fn step_down(&self) -> Result<bool, String> {
        let Some(p) = self.primary().await? else {
            return Ok(false);
        };
        Members::admin(
            &self.clients[p],
            doc! {
                "replSetStepDown": STEP_DOWN_FOR_SECS,
                "secondaryCatchUpPeriodSecs": 0,
                "labElectionDelayMS": ELECTION_DELAY_MS,
            },
        )
        .await?;
        Ok(true)
    }

    /// The index of the member that says it is primary, if one does.
    async fn primary(&self) -> Result<Option<usize>, String> {
        for (i, c) in self.clients.iter().enumerate() {
            let hello = Members::admin(c, doc! { "hello": 1 }).await?;
            if hello.get_bool("isWritablePrimary").unwrap_or(false) {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Steps primaries down until member `index` is primary, so that every run that starts
    /// after it meets the same primary, and with scheduled step-downs the same sequence of
    /// primaries. Members draw their random faults and rejections with salts of their own, so
    /// a run that started on another primary would meet other faults for the same requests.
    /// Bounded: at most `2 × members` step-downs, and `within` in all.
    pub(crate) async fn make_primary(&self, index: usize, within: Duration) -> Result<(), String> {
        if index >= self.clients.len() {
            return Err(format!("no member {index} among {}", self.clients.len()));
        }
        let deadline = Instant::now() + within;
        let mut step_downs = 0;
        let mut refused = None;
        while Instant::now() < deadline {
            match self.primary().await? {
                Some(p) if p == index => return Ok(()),
                Some(_) if step_downs < 2 * self.clients.len() => match self.step_down().await {
                    Ok(stepped) => step_downs += usize::from(stepped),
                    // Refused while every other member is still unelectable after its own
                    // recent step-down (262): ask again once one is.
                    Err(e) => refused = Some(e),
                },
                Some(p) => {
                    return Err(format!(
                        "member {p} is still primary after {step_downs} step-downs"
                    ))
                }
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "member {index} did not become primary within {within:?}{}",
            refused
                .map(|e| format!(" (last step-down refused: {e})"))
                .unwrap_or_default()
        ))
    }

    pub(crate) async fn shutdown(self) {
        for c in self.clients {
            c.shutdown().immediate(true).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emulator::{EmulatorConfig, Topology};

    /// The lab's runs start on member 0 however many step-downs came before (faults' common
    /// random numbers depend on it): from each primary the set can be left on, and from a set
    /// already on member 0 without a step-down.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn make_primary_hands_the_set_back_to_member_0() {
        let emu = emulator::Emulator::start(EmulatorConfig {
            topology: Topology::ReplicaSet {
                name: "lab".into(),
                members: 3,
            },
            ..EmulatorConfig::default()
        })
        .await
        .expect("emulator starts");
        let members = Members::connect(&emu.uri()).await.expect("members");
        let within = Duration::from_secs(10);
        assert_eq!(members.primary().await, Ok(Some(0)));
        members
            .make_primary(0, within)
            .await
            .expect("already primary");
        assert_eq!(emu.elections(), 0, "no step-down when member 0 is primary");
        for target in [1, 2, 0] {
            members
                .make_primary(target, within)
                .await
                .expect("hand-over");
            assert_eq!(members.primary().await, Ok(Some(target)));
        }
        // Round-robin elections: 0 → 1 (one), 1 → 2 (one), 2 → 0 (one).
        assert_eq!(emu.elections(), 3);
        assert!(members.make_primary(3, within).await.is_err());
        members.shutdown().await;
        emu.shutdown().await;
    }

    #[test]
    fn reads_member_hosts() {
        assert_eq!(
            member_hosts("mongodb://127.0.0.1:1,127.0.0.1:2/?replicaSet=lab"),
            vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()]
        );
    }
}
