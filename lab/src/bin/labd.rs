//! `labd`: the MongoDB wire-protocol emulator as a standalone server.

use std::net::IpAddr;

use clap::{Parser, ValueEnum};
use lab::{Emulator, EmulatorConfig, Topology};

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
