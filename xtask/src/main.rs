//! `cargo xtask`: the fork workflow (see docs/patch-workflow.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use xtask::fork::{DriverOutcome, Workspace};
use xtask::git::Git;
use xtask::pristine::{CargoRegistry, CrateSource, LocalMirror};
use xtask::project::Project;
use xtask::rebase::PatchFate;
use xtask::spec_fetch::Fetcher;
use xtask::{mutants, sync_spec, testrun};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Fork tooling for mongodb-overload")]
struct Cli {
    /// Take upstream `.crate` archives from this directory (named `<crate>-<version>.crate`)
    /// instead of downloading them through cargo; checksums are still verified.
    #[arg(long, global = true, value_name = "DIR")]
    mirror: Option<PathBuf>,

    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build driver/: pristine upstream from crates.io plus patches/series.
    Driver {
        /// Replace driver/ even if it holds work that patches/ does not.
        #[arg(long)]
        force: bool,
    },
    /// Rewrite patches/ from driver/'s commits (upstream..HEAD).
    Export,
    /// Fail when driver/ and patches/ disagree or a patch lacks its why or DEP-3 fields.
    Check,
    /// Try the series on another upstream version; report each patch.
    Rebase {
        /// The upstream version to try, e.g. 3.10.0.
        version: String,
    },
    /// Run every test (xtask, workspace, spec suites, patch-app). Spec JSON: SPEC_DIR, else
    /// spec-tests/data, else the commit pinned in spec-tests/SPEC_COMMIT (fetched once with git
    /// into target/spec-cache/, from SPEC_REPO_URL when set).
    Test,
    /// Run the overload lab (upstream and the fork side by side); arguments go to `lab run`.
    Lab {
        /// Arguments for `lab run`, e.g. `--full` or `--scenario sustained`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the fork with each named defect and run the spec, prose and defect suites against
    /// it (slow; see docs/mutants.md). Exits non-zero when a mutant survives.
    Mutants {
        /// The mutants to run; all when none is named.
        names: Vec<String>,
        /// List the mutants and exit.
        #[arg(long)]
        list: bool,
        /// Only check that every mutant applies to the current series and sources.
        #[arg(long)]
        check: bool,
    },
    /// Make a release: commit the fork as a standalone crate to the branch `dist/<upstream>`, tag
    /// it `v<upstream>+overload.<N>`, and package it as a `.crate` (docs/patch-workflow.md).
    Dist {
        /// The git repository that gets the branch and the tag (default: this project's).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
        /// Where the `.crate` file goes (default: target/dist).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Skip `cargo package`'s build of the package from the archive alone.
        #[arg(long)]
        no_verify: bool,
    },
    /// Run upstream's own test suite on pristine 3.9.1 and on the fork against labd, per
    /// topology, and write the comparison to docs/results/ (docs/upstream-tests.md). Tests:
    /// UPSTREAM_TESTS_DIR, else the commit pinned in upstream-tests/UPSTREAM_COMMIT.
    UpstreamTests {
        /// Topologies to run (standalone, replicaset, sharded); all when none is named.
        #[arg(long = "topology")]
        topologies: Vec<String>,
        /// Run only the fork's copy (CI), or only pristine; both by default.
        #[arg(long, value_parser = ["pristine", "fork"])]
        only: Option<String>,
        /// Run nothing: write the results file from the stored runs of both copies.
        #[arg(long, conflicts_with = "only")]
        report_only: bool,
        /// Print the summary but write no file to docs/results/ (CI).
        #[arg(long)]
        no_results_file: bool,
        /// nextest filters after `--` (a filtered run is printed, not stored).
        #[arg(last = true)]
        filters: Vec<String>,
    },
    /// Copy the spec suites the project runs from a specifications checkout into spec-tests/data.
    SyncSpec {
        /// A checkout of the specifications repository (it has a `source/` directory).
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    let source: Box<dyn CrateSource> = match cli.mirror {
        Some(dir) => Box::new(LocalMirror(dir)),
        None => Box::new(CargoRegistry::default()),
    };
    let ws = Workspace {
        project: Project::from_build(),
        git: Git::default(),
        source,
    };
    match cli.command {
        Cmd::Driver { force } => match ws.build_driver(force)? {
            DriverOutcome::UpToDate => {
                println!("driver/ already matches patches/series; nothing to do")
            }
            DriverOutcome::Built { patches } => {
                println!("driver/ built: pristine upstream + {patches} patches")
            }
        },
        Cmd::Export => {
            let changes = ws.export()?;
            if changes.is_empty() {
                println!("patches/ already matches driver/");
            }
            for change in changes {
                println!("{change}");
            }
        }
        Cmd::Check => {
            ws.check()?;
            // driver/ now equals the series applied to pristine upstream: check the mutants on it.
            let series: Vec<String> = xtask::series::read(&ws.project)?
                .into_iter()
                .map(|p| p.file)
                .collect();
            let problems = mutants::problems(&ws.project.driver_dir(), ws.project.root(), &series);
            if !problems.is_empty() {
                anyhow::bail!(
                    "{} problem(s):\n- {}",
                    problems.len(),
                    problems.join("\n- ")
                );
            }
            println!("ok: patches/ and driver/ agree, and the series applies to pristine upstream");
        }
        Cmd::Rebase { version } => {
            let report = ws.rebase(&version)?;
            for (file, fate) in &report.results {
                match fate {
                    PatchFate::Applied => println!("applied      {file}"),
                    PatchFate::AlreadyUpstream => println!("upstream has {file} (empty, dropped)"),
                    PatchFate::Conflicting(files) => {
                        println!("CONFLICTING  {file}: {}", files.join(", "))
                    }
                }
            }
            println!(
                "{} of {} patches conflict with {}; trial repository: {}",
                report.conflicts(),
                report.results.len(),
                report.target,
                report.repo.display()
            );
            if report.conflicts() > 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Test => {
            let spec = testrun::resolve_spec_dir(
                &ws.project,
                std::env::var_os("SPEC_DIR"),
                &Fetcher::from_env(),
            )?;
            println!("spec data: {spec}");
            let tally = ws.test(&spec.dir)?;
            println!(
                "{} passed, {} failed, {} skipped",
                tally.passed, tally.failed, tally.skipped
            );
            if tally.failed > 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Lab { args } => {
            if let DriverOutcome::Built { patches } = ws.build_driver(false)? {
                println!("built driver/ with {patches} patches");
            }
            let status = ws.run_lab(&args)?;
            if !status.success() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Mutants { names, list, check } => {
            return mutants::command(&ws, &names, list, check);
        }
        Cmd::Dist {
            repo,
            out,
            no_verify,
        } => xtask::dist::print(&ws.dist(&xtask::dist::DistOptions {
            repo: repo.unwrap_or_else(|| ws.project.root().to_owned()),
            out_dir: out.unwrap_or_else(|| ws.project.root().join("target/dist")),
            verify: !no_verify,
        })?),
        Cmd::UpstreamTests {
            topologies,
            only,
            report_only,
            no_results_file,
            filters,
        } => {
            let only = if report_only {
                Some("none")
            } else {
                only.as_deref()
            };
            return upstream_tests_command(&ws, &topologies, only, filters, !no_results_file);
        }
        Cmd::SyncSpec { dir } => {
            let copied = sync_spec::sync_spec(&ws.project, &dir)?;
            println!("copied {copied} spec files into spec-tests/data");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn upstream_tests_command(
    ws: &Workspace,
    topologies: &[String],
    only: Option<&str>,
    filters: Vec<String>,
    results_file: bool,
) -> Result<ExitCode> {
    use xtask::upstream_tests::{self, prepare::Variant, report, run::Topology};
    let topologies = if topologies.is_empty() {
        Topology::ALL.to_vec()
    } else {
        topologies
            .iter()
            .map(|t| Topology::parse(t))
            .collect::<Result<_>>()?
    };
    let variants = match only {
        Some("pristine") => vec![Variant::Pristine],
        Some("fork") => vec![Variant::Fork],
        Some(_) => Vec::new(),
        None => vec![Variant::Pristine, Variant::Fork],
    };
    let write_results = results_file && filters.is_empty();
    let options = upstream_tests::Options {
        topologies,
        variants,
        filters,
        write_results,
    };
    let results = upstream_tests::command(ws, &options)?;
    let known = upstream_tests::known_regressions(&ws.project)?;
    let mut regressions = 0;
    for topology in &results {
        let (listed, new): (Vec<_>, Vec<_>) = topology
            .regressions()
            .into_iter()
            .partition(|(name, _)| known.contains(&(topology.topology.clone(), name.to_string())));
        for (name, _) in &new {
            println!("new regression ({}): {name}", topology.topology);
        }
        if !listed.is_empty() {
            println!(
                "{} of {}'s regressions are listed in upstream-tests/known-regressions",
                listed.len(),
                topology.topology
            );
        }
        regressions += new.len();
        for line in report::summary_lines(topology) {
            println!("{line}");
        }
    }
    Ok(if regressions > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
