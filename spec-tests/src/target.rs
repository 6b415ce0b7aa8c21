//! Where tests run: a fresh emulator per test (the default), or the deployment in `MONGODB_URI`.

use bson::{doc, Document};

use crate::mongodb::Client;
use crate::requirements::{parse_version, TargetInfo};
use crate::schema::TopologyKind;

/// The server version the emulator reports, for requirement checks.
pub const EMULATOR_SERVER_VERSION: (u32, u32, u32) = (8, 2, 0);

/// How this run reaches a server.
#[derive(Debug, Clone)]
pub enum Mode {
    /// One emulator per test, of the topology the file needs.
    Emulator,
    /// The deployment named by `MONGODB_URI`, probed once.
    External { uri: String, info: TargetInfo },
}

impl Mode {
    /// The emulator's description for a topology, as requirements see it.
    pub fn emulator_info(topology: TopologyKind) -> TargetInfo {
        TargetInfo {
            version: EMULATOR_SERVER_VERSION,
            topology,
            serverless: false,
            auth: false,
            server_parameters: None,
        }
    }
}

/// A running target for one test.
pub struct Running {
    pub uri: String,
    pub topology: TopologyKind,
    /// Several mongoses are listed in the URI: clients not asking for them keep only the first.
    pub multiple_routers: bool,
    emulator: Option<EmulatorHandle>,
}

impl Running {
    pub async fn shutdown(self) {
        if let Some(handle) = self.emulator {
            handle.shutdown().await;
        }
    }
}

/// Whether this build can start an emulator.
pub fn emulator_available() -> bool {
    EmulatorHandle::AVAILABLE
}

/// Starts what a test runs against; `auth`: an emulator that requires authentication, with the
/// runner's user in the returned URI.
pub async fn start(mode: &Mode, topology: TopologyKind, auth: bool) -> Result<Running, String> {
    match mode {
        Mode::External { uri, info } => Ok(Running {
            uri: uri.clone(),
            topology: info.topology,
            multiple_routers: info.topology == TopologyKind::Sharded && uri_host_count(uri) > 1,
            emulator: None,
        }),
        Mode::Emulator => {
            let handle = EmulatorHandle::start(topology, auth).await?;
            Ok(Running {
                uri: handle.uri(),
                topology,
                multiple_routers: topology == TopologyKind::Sharded,
                emulator: Some(handle),
            })
        }
    }
}

fn uri_host_count(uri: &str) -> usize {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or("");
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts.split(',').filter(|h| !h.is_empty()).count()
}

/// Probes a real deployment: version from `buildInfo`, topology from `hello`, parameters from
/// `getParameter: "*"`.
pub async fn probe(uri: &str) -> Result<TargetInfo, String> {
    let client = Client::with_uri_str(uri)
        .await
        .map_err(|e| format!("MONGODB_URI {uri}: {e}"))?;
    let admin = client.database("admin");
    let build = admin
        .run_command(doc! {"buildInfo": 1})
        .await
        .map_err(|e| format!("buildInfo on MONGODB_URI failed: {e}"))?;
    let version_text = build.get_str("version").unwrap_or("0.0.0");
    let version = parse_version(version_text)
        .ok_or_else(|| format!("cannot parse the server version {version_text:?}"))?;
    let hello = admin
        .run_command(doc! {"hello": 1})
        .await
        .map_err(|e| format!("hello on MONGODB_URI failed: {e}"))?;
    let topology = if hello.get_str("msg") == Ok("isdbgrid") {
        TopologyKind::Sharded
    } else if hello.contains_key("setName") {
        TopologyKind::ReplicaSet
    } else {
        TopologyKind::Single
    };
    let server_parameters: Option<Document> =
        admin.run_command(doc! {"getParameter": "*"}).await.ok();
    let options = crate::mongodb::options::ClientOptions::parse(uri)
        .await
        .map_err(|e| e.to_string())?;
    Ok(TargetInfo {
        version,
        topology,
        serverless: false,
        auth: options.credential.is_some(),
        server_parameters,
    })
}

/// Replica-set members the emulator starts: one keeps SDAM event counts deterministic.
pub const EMULATOR_RS_MEMBERS: usize = 1;
/// Routers in the sharded persona: two, so `useMultipleMongoses` means something.
pub const EMULATOR_ROUTERS: usize = 2;

/// The user of an emulator started for `auth: true` cases (root on `admin`, both SCRAM
/// mechanisms), as the unified format's test runner is given credentials in its URI.
pub const EMULATOR_USER: (&str, &str) = ("spec-runner", "spec-runner-password");

/// A running `emulator::Emulator`.
#[cfg(feature = "emulator")]
struct EmulatorHandle {
    emulator: emulator::Emulator,
    /// The user whose credentials the URI carries, when authentication is on.
    user: Option<emulator::UserConfig>,
}

#[cfg(feature = "emulator")]
impl EmulatorHandle {
    const AVAILABLE: bool = true;

    async fn start(topology: TopologyKind, auth: bool) -> Result<Self, String> {
        let topology = match topology {
            TopologyKind::Single => emulator::Topology::Standalone,
            TopologyKind::ReplicaSet => emulator::Topology::ReplicaSet {
                name: "rs0".to_string(),
                members: EMULATOR_RS_MEMBERS,
            },
            TopologyKind::Sharded | TopologyKind::ShardedReplicaSet => {
                emulator::Topology::Sharded {
                    routers: EMULATOR_ROUTERS,
                }
            }
            TopologyKind::LoadBalanced => {
                return Err("the emulator has no load-balanced persona".to_string())
            }
        };
        let user = auth.then(|| emulator::UserConfig::admin(EMULATOR_USER.0, EMULATOR_USER.1));
        let config = emulator::EmulatorConfig {
            topology,
            server_version: format!(
                "{}.{}.{}",
                EMULATOR_SERVER_VERSION.0, EMULATOR_SERVER_VERSION.1, EMULATOR_SERVER_VERSION.2
            ),
            users: user.iter().cloned().collect(),
            ..emulator::EmulatorConfig::default()
        };
        let emulator = emulator::Emulator::start(config)
            .await
            .map_err(|e| format!("cannot start the emulator: {e}"))?;
        Ok(EmulatorHandle { emulator, user })
    }

    fn uri(&self) -> String {
        match &self.user {
            Some(user) => self.emulator.uri_with_credentials(user),
            None => self.emulator.uri(),
        }
    }

    async fn shutdown(self) {
        self.emulator.shutdown().await;
    }
}

/// Stands in for the emulator when the `emulator` feature is off: starting it fails.
#[cfg(not(feature = "emulator"))]
struct EmulatorHandle {
    uri: String,
}

#[cfg(not(feature = "emulator"))]
impl EmulatorHandle {
    const AVAILABLE: bool = false;

    async fn start(topology: TopologyKind, auth: bool) -> Result<Self, String> {
        let _ = (topology, auth);
        Err(crate::skips::NO_TARGET.to_string())
    }

    fn uri(&self) -> String {
        self.uri.clone()
    }

    async fn shutdown(self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_hosts() {
        assert_eq!(uri_host_count("mongodb://a:1,b:2/?x=1"), 2);
        assert_eq!(uri_host_count("mongodb://u:p@a:1/db"), 1);
        assert_eq!(uri_host_count("mongodb://a"), 1);
    }
}
