//! `flashraid`: the command-line front of the RAID engine.
//!
//! Owns: argument parsing, turning library errors into messages a person can act on, and
//! output formats (tables for people, `--json` for scripts).
//!
//! Today it runs the parity benchmark (`flashraid bench parity`) and reports which parity
//! kernels this CPU has (`flashraid kernels`). Arrays (create, assemble, serve, status) arrive
//! with the engine and NBD issues; the README says what works today.

#![forbid(unsafe_code)]

mod bench;

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
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(command) => bench::run(command),
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
