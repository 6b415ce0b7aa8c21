//! `cargo xtask lab`: builds the overload lab with the `lab` profile and runs it.

use std::process::ExitStatus;

use anyhow::{Context, Result};

use crate::fork::Workspace;

impl Workspace {
    /// Runs `lab run <args>`: the load generator against its in-process emulator, upstream and
    /// the fork side by side (`--scenario NAME` for one scenario, `--suite` for all of them and
    /// the verdict; `docs/lab.md`).
    pub fn run_lab(&self, args: &[String]) -> Result<ExitStatus> {
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
            .args(["--", "run"])
            .args(args)
            .status()
            .context("cannot run cargo for the lab")
    }
}
