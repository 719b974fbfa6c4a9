//! `flashraid`: the command-line front of the RAID engine.
//!
//! Owns: argument parsing, turning library errors into messages a person can act on, and
//! output formats (tables for people, `--json` for scripts).
//!
//! Commands: `create` (arrays on files or block devices), `inspect` (superblocks, offline),
//! `assemble` (the assembly decision, read-only), `bench parity`, `bench engine`, `kernels`.
//! Serving arrays (`serve`, `status`, `fail`) arrives with the NBD issue.

#![forbid(unsafe_code)]
// `status --json` is one `json!` literal, deeper than the macro's default recursion allows.
#![recursion_limit = "256"]

mod array_cmds;
mod bench;
mod control;
mod lab;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "flashraid", version, about = "Software RAID for NVMe and SSD arrays")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks: `flashraid bench parity`.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// List the parity kernels and which one this CPU uses.
    Kernels,
    /// Create an array on member files or block devices.
    Create(array_cmds::CreateArgs),
    /// Print the superblocks on devices, offline.
    Inspect(array_cmds::InspectArgs),
    /// Show how devices would assemble (read-only).
    Assemble(array_cmds::AssembleArgs),
    /// Start arrays and export them over NBD (Unix socket, TCP, optionally TLS).
    Serve(serve::ServeArgs),
    /// A served array's state, members, counters and connections (`--json` for scripts).
    Status(control::StatusArgs),
    /// Fail a member of a served array now (like `mdadm --fail`).
    Fail(control::FailArgs),
    /// Stop a served array (like `mdadm --stop`): drained, flushed, marked clean, while the
    /// server's other arrays serve on; a server's only array, or `--all`, stops the server
    /// as SIGTERM does. Refused while NBD clients are connected unless `--force`.
    Stop(control::StopArgs),
    /// Start another array in a running server, beside the arrays it serves (an array
    /// stopped alone comes back this way): `flashraid start --server SERVED MEMBER...`.
    Start(control::StartArgs),
    /// Show the rebuild of a served array, set its rate, or wait for it with a progress bar.
    Rebuild(control::RebuildArgs),
    /// Change a served array's tunables live (stored with the array), or show them.
    Tune(control::TuneArgs),
    /// Check every stripe of a served array (or repair with --repair), with a progress bar.
    Scrub(control::ScrubArgs),
    /// Add a hot spare to a served array, or take one out: `flashraid spare add|remove DEVICE`.
    Spare(control::SpareArgs),
    /// Replace a member of a served array with a new device (copied from it while the array
    /// keeps its redundancy, then only what was written meanwhile is rebuilt); `--cancel` gives
    /// up a running one.
    Replace(control::ReplaceArgs),
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The cause chain on one line each, no backtrace: messages are for operators.
            eprintln!("flashraid: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if !matches!(cli.command, Command::Serve(_)) {
        flashraid_nbd::signals::default_sigpipe();
    }
    match cli.command {
        Command::Bench(command) => bench::run(command),
        Command::Create(args) => array_cmds::run_create(args),
        Command::Inspect(args) => array_cmds::run_inspect(args),
        Command::Assemble(args) => array_cmds::run_assemble(args),
        Command::Serve(args) => serve::run_serve(args),
        Command::Status(args) => control::run_status(args),
        Command::Fail(args) => control::run_fail(args),
        Command::Stop(args) => control::run_stop(args),
        Command::Start(args) => control::run_start(args),
        Command::Rebuild(args) => control::run_rebuild(args),
        Command::Tune(args) => control::run_tune(args),
        Command::Scrub(args) => control::run_scrub(args),
        Command::Spare(args) => control::run_spare(args),
        Command::Replace(args) => control::run_replace(args),
        Command::Kernels => {
            let best = flashraid_parity::Kernel::best();
            for kernel in flashraid_parity::Kernel::ALL {
                let state = match (kernel.is_supported(), kernel == best) {
                    (true, true) => "supported, selected",
                    (true, false) => "supported",
                    (false, _) => "not supported by this CPU",
                };
                println!("{:<12} {state}", kernel.name());
            }
            Ok(())
        }
    }
}
