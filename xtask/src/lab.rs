//! `cargo xtask lab`: builds the overload lab with the `lab` profile and runs it.

use std::process::ExitStatus;

use anyhow::{Context, Result};

use crate::fork::Workspace;

impl Workspace {
    /// Runs `lab run <args>`: the load generator against its in-process emulator, upstream and
    /// the fork side by side (`--scenario NAME` for one scenario, `--suite` for all of them and
    /// the verdict; `docs/lab.md`).
    ///
    /// `cargo xtask lab --count-instructions [ARGS]` builds every lab binary and runs
    /// `lab instructions ARGS` instead: callgrind counts of `pathbench` for the verdict's
    /// instructions per operation (`lab run --suite --instructions FILE`).
    pub fn run_lab(&self, args: &[String]) -> Result<ExitStatus> {
        let (subcommand, args) = match args.split_first() {
            Some((first, rest)) if first == "--count-instructions" => {
                // `lab instructions` runs `pathbench`, built beside it.
                let built = crate::project::cargo_command()
                    .args([
                        "build",
                        "--quiet",
                        "--profile",
                        "lab",
                        "-p",
                        "lab",
                        "--bins",
                    ])
                    .arg("--manifest-path")
                    .arg(self.project.root().join("Cargo.toml"))
                    .status()
                    .context("cannot build the lab")?;
                if !built.success() {
                    return Ok(built);
                }
                ("instructions", rest)
            }
            _ => ("run", args),
        };
        crate::project::cargo_command()
            .args([
                "run",
                "--quiet",
                "--profile",
                "lab",
                "-p",
                "lab",
                "--bin",
                "lab",
            ])
            .arg("--manifest-path")
            .arg(self.project.root().join("Cargo.toml"))
            .args(["--", subcommand])
            .args(args)
            .status()
            .context("cannot run cargo for the lab")
    }
}
