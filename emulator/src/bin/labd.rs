//! `labd`: the MongoDB wire-protocol emulator as a standalone server.

use std::net::IpAddr;

use clap::{Parser, ValueEnum};
use emulator::{Emulator, EmulatorConfig, Topology, UserConfig};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TopologyArg {
    Standalone,
    Replicaset,
    Sharded,
}

/// MongoDB wire-protocol emulator.
#[derive(Debug, Parser)]
#[command(name = "labd", version, about)]
struct Args {
    /// Deployment shape.
    #[arg(long, value_enum, default_value = "standalone")]
    topology: TopologyArg,
    /// Replica-set members or mongos routers.
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Shards behind the routers (`--topology sharded` only). With two or more, the overload
    /// model options below apply to every shard and the routers' models are off unless
    /// --member-model-json names them; with one, the routers carry them as before.
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Replica set name.
    #[arg(long, default_value = "rs0")]
    set_name: String,
    /// Port of the first member (the others follow); 0 picks ephemeral ports.
    #[arg(long, default_value_t = 27017)]
    port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Version reported by buildInfo.
    #[arg(long, default_value = "8.2.0")]
    server_version: String,
    /// maxWireVersion reported by hello.
    #[arg(long, default_value_t = 25)]
    max_wire_version: i32,
    /// Omit topologyVersion from hello (the driver then polls instead of streaming).
    #[arg(long)]
    no_topology_version: bool,
    /// Idle cursors are closed after this many milliseconds.
    #[arg(long, default_value_t = 600_000)]
    cursor_timeout_ms: u64,
    /// Initial `externalClientBaseBackoffMS` (adds `baseBackoffMS` to overload errors).
    #[arg(long, default_value_t = 0)]
    base_backoff_ms: i32,
    /// Turn the overload model on (also settable at run time: `setParameter: {labOverload: {...}}`).
    #[arg(long)]
    overload: bool,
    /// Overload model: ingress rate limit in requests per second (enables the limiter).
    #[arg(long)]
    ingress_rate: Option<f64>,
    /// Overload model: ingress burst capacity in seconds of rate.
    #[arg(long)]
    ingress_burst_secs: Option<f64>,
    /// Overload model: requests that may queue for an ingress token (0 rejects at once).
    #[arg(long)]
    ingress_queue: Option<u64>,
    /// Overload model: number of virtual cores.
    #[arg(long)]
    cores: Option<u32>,
    /// Overload model: share of data requests rejected at random with a retryable 462 (0 to 1).
    #[arg(long)]
    random_reject_share: Option<f64>,
    /// Overload model of every member: a JSON object of `labOverload` settings, merged over the
    /// options above (e.g. '{"enabled": true, "costs": {"rejectionMs": 0.3}}').
    #[arg(long, value_name = "JSON")]
    model_json: Option<String>,
    /// Overload model of one member: INDEX=JSON, merged over every member's model (repeatable;
    /// 0 is the first member), e.g. '1={"cores": 1}'.
    #[arg(long, value_name = "INDEX=JSON")]
    member_model_json: Vec<String>,
    /// Overload model of one shard: INDEX=JSON, merged over the model the options above give
    /// (repeatable; 0 is shard0), e.g. '1={"randomRejectShare": 1.0}'.
    #[arg(long, value_name = "INDEX=JSON")]
    shard_model_json: Vec<String>,
    /// A user created at start, NAME:PASSWORD (on admin) or DB.NAME:PASSWORD, with SCRAM-SHA-1
    /// and SCRAM-SHA-256 credentials (repeatable). Any user turns authentication on: commands
    /// then need an authenticated connection, as on a mongod started with --auth
    #[arg(long = "user", value_name = "NAME:PASSWORD", value_parser = UserConfig::parse)]
    users: Vec<UserConfig>,
}

/// Parses a JSON object of `labOverload` settings.
fn json_document(text: &str) -> Result<bson::Document, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match bson::Bson::try_from(value) {
        Ok(bson::Bson::Document(d)) => Ok(d),
        Ok(_) => Err("not a JSON object".to_string()),
        Err(e) => Err(format!("not a BSON document: {e}")),
    }
}

/// Models by member or shard index.
type ModelMap = std::collections::BTreeMap<usize, emulator::model::ModelConfig>;

/// The model of every member (or shard), the per-member models and the per-shard models.
type Models = (emulator::model::ModelConfig, ModelMap, ModelMap);

/// Parses repeated `INDEX=JSON` flags (`flag` names them in errors) into models merged over
/// `base` (an index given twice merges both, in order).
fn indexed_models(
    flag: &str,
    specs: &[String],
    base: &emulator::model::ModelConfig,
) -> Result<ModelMap, String> {
    let mut models = ModelMap::new();
    for spec in specs {
        let (index, text) = spec
            .split_once('=')
            .ok_or_else(|| format!("{flag} {spec}: expected INDEX=JSON"))?;
        let index: usize = index
            .trim()
            .parse()
            .map_err(|_| format!("{flag} {spec}: {index:?} is not an index"))?;
        let changes = json_document(text).map_err(|e| format!("{flag} {index}: {e}"))?;
        let model = models
            .get(&index)
            .unwrap_or(base)
            .merged(&changes)
            .map_err(|e| format!("{flag} {index}: {e}"))?;
        models.insert(index, model);
    }
    Ok(models)
}

/// The model of every member (from the flags) and the per-member overrides.
fn models(args: &Args) -> Result<Models, String> {
    let mut overload = emulator::model::ModelConfig {
        enabled: args.overload,
        ..Default::default()
    };
    if let Some(rate) = args.ingress_rate {
        overload.limiter.enabled = true;
        overload.limiter.rate_per_sec = rate;
    }
    if let Some(b) = args.ingress_burst_secs {
        overload.limiter.burst_capacity_secs = b;
    }
    if let Some(q) = args.ingress_queue {
        overload.limiter.max_queue_depth = q;
    }
    if let Some(c) = args.cores {
        overload.cores = c;
    }
    if let Some(share) = args.random_reject_share {
        overload.random_reject_share = share;
    }
    if let Some(text) = &args.model_json {
        let changes = json_document(text).map_err(|e| format!("--model-json: {e}"))?;
        overload = overload
            .merged(&changes)
            .map_err(|e| format!("--model-json: {e}"))?;
    }
    overload.validate().map_err(|e| e.to_string())?;
    let members = indexed_models("--member-model-json", &args.member_model_json, &overload)?;
    let shards = indexed_models("--shard-model-json", &args.shard_model_json, &overload)?;
    Ok((overload, members, shards))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let topology = match args.topology {
        TopologyArg::Standalone => Topology::Standalone,
        TopologyArg::Replicaset => Topology::ReplicaSet {
            name: args.set_name.clone(),
            members: args.members.max(1),
        },
        TopologyArg::Sharded => Topology::Sharded {
            routers: args.members.max(1),
        },
    };
    let (overload, member_overload, shard_overload) = match models(&args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("labd: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let config = EmulatorConfig {
        topology,
        server_version: args.server_version,
        max_wire_version: args.max_wire_version,
        port: if args.port == 0 {
            None
        } else {
            Some(args.port)
        },
        bind: args.bind,
        topology_version: !args.no_topology_version,
        cursor_timeout: std::time::Duration::from_millis(args.cursor_timeout_ms.max(1)),
        base_backoff_ms: args.base_backoff_ms.max(0),
        overload,
        member_overload,
        shards: args.shards.max(1),
        shard_overload,
        users: args.users,
        ..Default::default()
    };
    let emulator = match Emulator::start(config).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("labd: cannot start: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    // Install the handler before announcing the URI, so an early Ctrl-C is never fatal.
    #[cfg(unix)]
    let mut interrupt =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("labd: cannot handle Ctrl-C: {e}");
                return std::process::ExitCode::from(1);
            }
        };
    println!("{}", emulator.uri());
    #[cfg(unix)]
    interrupt.recv().await;
    #[cfg(not(unix))]
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("labd: cannot wait for Ctrl-C: {e}");
    }
    tracing::info!("Ctrl-C received, shutting down");
    emulator.shutdown().await;
    std::process::ExitCode::SUCCESS
}
