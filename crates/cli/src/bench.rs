//! `flashraid bench ...`: command-line front of the benchmark lab.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use flashraid_bench::parity::{self, Config, Op, Regime};
use flashraid_parity::Kernel;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Parity kernels vs ISA-L and memory bandwidth, one core (GB/s of data).
    Parity(ParityArgs),
    /// The array engine in-process vs its raw member files, same run (IOPS, GB/s, latency,
    /// CPU per IO).
    Engine(EngineArgs),
    /// The array healthy, with a member failed, and rebuilding onto a hot spare (in-memory
    /// members): degraded read ratios, rebuild rate, foreground latency during the rebuild.
    Rebuild(RebuildArgs),
    /// The lab: SNIA PTS profiles through fio against the raw members, a flashraid array
    /// (over NBD) and devices you name, side by side; writes a report folder (Markdown,
    /// HTML with charts, CSV, raw fio JSON, manifest).
    Run(crate::lab::LabRunArgs),
    /// Put earlier `bench run` reports side by side (ratios to the first).
    Compare(crate::lab::LabCompareArgs),
}

#[derive(Args, Debug)]
pub struct RebuildArgs {
    #[arg(long, default_value = "6")]
    level: flashraid_layout::Level,
    #[arg(long, default_value_t = 8)]
    members: usize,
    #[arg(long, default_value_t = 16)]
    chunk_kib: u64,
    /// Size of each in-memory member (needs (members + 2) x this of RAM).
    #[arg(long, default_value = "512M", value_parser = crate::array_cmds::parse_size)]
    member_size: u64,
    #[arg(long, default_value_t = 2)]
    shards: u32,
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds per measured load.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rebuild rate limit during the paced load (e.g. 200M; 0: none), as `serve
    /// --rebuild-rate` sets it.
    #[arg(long, default_value = "0", value_parser = crate::array_cmds::parse_size)]
    rebuild_rate: u64,
    /// The rebuild's limit while clients use the array (`serve --rebuild-busy-rate`).
    #[arg(long, default_value = "200M", value_parser = crate::array_cmds::parse_size)]
    rebuild_busy_rate: u64,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct EngineArgs {
    /// RAID level.
    #[arg(long, default_value = "6")]
    level: flashraid_layout::Level,
    /// Members.
    #[arg(long, default_value_t = 8)]
    members: usize,
    #[arg(long, default_value_t = 16)]
    chunk_kib: u64,
    /// Size of each member file.
    #[arg(long, default_value = "512M", value_parser = crate::array_cmds::parse_size)]
    member_size: u64,
    /// Where the members live: `files` (in --dir, through io_uring) or `memory` (the engine
    /// alone: no kernel in the IO path; needs members x member-size of RAM).
    #[arg(long, default_value = "files", value_parser = ["files", "memory"])]
    backend: String,
    /// How the array load reaches the engine: `pollers` (jobs run inside the reactor threads,
    /// which poll) or `threads` (a thread per job hands requests to the reactors).
    #[arg(long, default_value = "pollers", value_parser = ["pollers", "threads"])]
    drive: String,
    /// Directory for the member files (tmpfs: O_DIRECT works there on Linux 6.6+).
    #[arg(long, default_value = "/dev/shm/flashraid-bench")]
    dir: PathBuf,
    /// Reactor threads.
    #[arg(long, default_value_t = 2)]
    shards: u32,
    /// Load threads.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// IOs in flight per load thread.
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// Workloads, comma-separated: randread-4k, randwrite-4k, seqread-128k, seqread-1m,
    /// seqwrite-stripe.
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// A load of your own shape instead of the standard workloads: `rand` or `seq`...
    #[arg(long, value_parser = ["rand", "seq"])]
    pattern: Option<String>,
    /// ...with this block size (e.g. 4K, 64K, 1M; default 4K)...
    #[arg(long, value_parser = crate::array_cmds::parse_size)]
    block_size: Option<u64>,
    /// ...and this share of reads, 0-100 (default 100; e.g. 70 for a 70/30 mix).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_percent: Option<u8>,
    /// Merge window for partial-stripe writes, microseconds.
    #[arg(long, default_value_t = 0)]
    merge_window_us: u64,
    /// KiB of every member each shard's run of neighbouring stripes covers (0: one stripe);
    /// longer runs let io_uring members merge neighbouring chunks into one IO under load.
    #[arg(long, default_value_t = 0)]
    stripe_run_kib: u64,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ParityArgs {
    /// Fewer, shorter repetitions and a 1 GiB cold pool: a first look, not a result.
    #[arg(long)]
    quick: bool,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Parity kernel to measure (scalar, avx2, avx2-gfni, avx512-gfni); default: the best.
    #[arg(long)]
    kernel: Option<Kernel>,
    /// An ISA-L library to compare with (repeatable). Default: the system's libisal.so.2 and
    /// the newer one scripts/fetch-isal.sh unpacks, whichever exist.
    #[arg(long = "isal", value_name = "PATH")]
    isal: Vec<PathBuf>,
    /// Chunk sizes in KiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64,256")]
    chunk_kib: Vec<usize>,
    /// Data chunks per stripe.
    #[arg(long, default_value_t = 10)]
    data_chunks: usize,
    /// Only these cases: hot, cold, or both.
    #[arg(long, value_delimiter = ',', default_value = "hot,cold")]
    regime: Vec<String>,
    /// Repetitions per figure (the median is reported); default 5 (3 with --quick).
    #[arg(long)]
    repetitions: Option<usize>,
    /// Size of the cold pool in MiB; must exceed the last-level cache. Default 2048 (1024 with
    /// --quick).
    #[arg(long)]
    pool_mib: Option<usize>,
    /// Pin the measuring thread to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
}

/// ISA-L libraries to try when none are named.
fn default_isal_paths() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = flashraid_isal_system_paths();
    let cache = std::env::var_os("FLASHRAID_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/flashraid")));
    if let Some(cache) = cache {
        let newer = cache.join("isal-2.31/usr/lib/x86_64-linux-gnu/libisal.so.2");
        if newer.exists() {
            paths.push(newer);
        }
    }
    paths
}

fn flashraid_isal_system_paths() -> Vec<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu/libisal.so.2", "/usr/lib64/libisal.so.2"]
        .into_iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .take(1)
        .collect()
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Parity(args) => run_parity(args),
        BenchCommand::Engine(args) => run_engine(args),
        BenchCommand::Rebuild(args) => run_rebuild(args),
        BenchCommand::Run(args) => crate::lab::run_lab(args),
        BenchCommand::Compare(args) => crate::lab::run_compare(args),
    }
}

fn run_rebuild(args: RebuildArgs) -> Result<()> {
    use flashraid_bench::rebuild::{Config, format_report, run};
    let config = Config {
        level: args.level,
        members: args.members,
        chunk_bytes: args.chunk_kib << 10,
        member_bytes: args.member_size,
        shards: args.shards,
        jobs: args.jobs,
        queue_depth: args.qd,
        run_time: Duration::from_secs_f64(args.seconds),
        rate_under_load: args.rebuild_rate,
        busy_rate: args.rebuild_busy_rate,
    };
    let report = run(&config, |line| eprintln!("{line}")).map_err(anyhow::Error::msg)?;
    print!("{}", format_report(&report));
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn run_engine(args: EngineArgs) -> Result<()> {
    use flashraid_bench::engine::{Backend, Config, Workload, format_report, run};
    use flashraid_bench::load::Drive;
    let custom = args.pattern.is_some() || args.block_size.is_some() || args.read_percent.is_some();
    let workloads = if custom {
        if !args.workloads.is_empty() {
            bail!("give either --workloads or --pattern/--block-size/--read-percent");
        }
        let block_bytes = args.block_size.unwrap_or(4096);
        if block_bytes == 0 || !block_bytes.is_multiple_of(4096) || block_bytes > 16 << 20 {
            bail!("--block-size must be a multiple of 4 KiB, at most 16 MiB");
        }
        vec![Workload::Custom {
            sequential: args.pattern.as_deref() == Some("seq"),
            block_bytes: block_bytes as u32,
            read_percent: args.read_percent.unwrap_or(100),
        }]
    } else if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workloads
            .iter()
            .map(|w| Workload::parse(w).ok_or_else(|| anyhow::anyhow!("unknown workload {w:?}")))
            .collect::<Result<_>>()?
    };
    if args.seconds <= 0.0 || args.repetitions == 0 || args.jobs == 0 || args.qd == 0 {
        bail!("--seconds, --repetitions, --jobs and --qd must be positive");
    }
    let config = Config {
        level: args.level,
        members: args.members,
        chunk_bytes: args.chunk_kib << 10,
        member_bytes: args.member_size,
        dir: args.dir,
        shards: args.shards,
        jobs: args.jobs,
        queue_depth: args.qd,
        run_time: Duration::from_secs_f64(args.seconds),
        repetitions: args.repetitions,
        workloads,
        merge_window_us: args.merge_window_us,
        stripe_run_member_bytes: args.stripe_run_kib << 10,
        backend: if args.backend == "memory" { Backend::Memory } else { Backend::Files },
        drive: if args.drive == "threads" { Drive::Threads } else { Drive::Pollers },
    };
    println!(
        "flashraid engine benchmark: {} x{} members, {} KiB chunks, {} per member in {}; {} shards, {} jobs x QD {} ({}), {} x {:.1} s",
        config.level,
        config.members,
        args.chunk_kib,
        crate::array_cmds::human(config.member_bytes),
        if config.backend == Backend::Memory {
            "memory".to_string()
        } else {
            config.dir.display().to_string()
        },
        config.shards,
        config.jobs,
        config.queue_depth,
        args.drive,
        config.repetitions,
        config.run_time.as_secs_f64()
    );
    let report = run(&config, |line| println!("  {line}")).map_err(|e| anyhow::anyhow!(e))?;
    println!();
    print!("{}", format_report(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("JSON written to {}", path.display());
    }
    Ok(())
}

fn run_parity(args: ParityArgs) -> Result<()> {
    let isal = if args.isal.is_empty() { default_isal_paths() } else { args.isal.clone() };
    let mut config = if args.quick { Config::quick(isal) } else { Config::full(isal) };
    config.data_chunks = args.data_chunks;
    config.chunk_sizes_bytes = args.chunk_kib.iter().map(|kib| kib << 10).collect();
    config.regimes = args
        .regime
        .iter()
        .map(|r| match r.as_str() {
            "hot" => Ok(Regime::Hot),
            "cold" => Ok(Regime::Cold),
            other => bail!("unknown regime {other:?}: use hot, cold or hot,cold"),
        })
        .collect::<Result<_>>()?;
    config.ops = Op::ALL.to_vec();
    if let Some(kernel) = args.kernel {
        if !kernel.is_supported() {
            bail!(
                "this CPU cannot run the {kernel} kernel; `flashraid kernels` lists the ones it can"
            );
        }
        config.kernel = kernel;
    }
    if let Some(repetitions) = args.repetitions {
        if repetitions == 0 {
            bail!("--repetitions must be at least 1");
        }
        config.repetitions = repetitions;
    }
    if let Some(mib) = args.pool_mib {
        config.cold_pool_bytes = mib << 20;
    }
    config.cpu = args.cpu;
    if args.quick {
        config.repetition_cpu = Duration::from_millis(40);
    }

    println!(
        "flashraid parity benchmark: k = {} data chunks, kernel {}, one core{}, median of {} x {} ms CPU time{}",
        config.data_chunks,
        config.kernel,
        config.cpu.map_or(String::new(), |c| format!(" (CPU {c})")),
        config.repetitions,
        config.repetition_cpu.as_millis(),
        if args.quick { " (quick: a first look, not a result)" } else { "" },
    );
    println!(
        "GB/s of data (10^9 B/s); 'traffic' = bytes moved by flashraid's better store mode / one core's read bandwidth"
    );
    println!("{}", parity::table_header());
    let report = parity::run(&config, |line| println!("{line}"))?;
    for (version, path) in &report.isal_libraries {
        println!("ISA-L {version}: {path}");
    }
    for error in &report.isal_load_errors {
        println!("ISA-L not used: {error}");
    }
    if report.isal_libraries.is_empty() {
        println!("No ISA-L loaded: install libisal-dev, or run scripts/fetch-isal.sh for 2.31.");
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("JSON written to {}", path.display());
    }
    Ok(())
}
