//! `flashraid serve`: assemble an array from its members and export it over NBD until
//! SIGTERM or SIGINT, then drain, flush, mark it clean and exit.

use anyhow::{Context, Result, bail};
use clap::Args;
use flashraid_nbd::{ExportConfig, Listener, Server};
use flashraid_runtime::{Array, OpenOptions, Stopped};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Unix socket to listen on (nbd+unix:///NAME?socket=PATH).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also listen on TCP at this address, e.g. 127.0.0.1:10809. Addresses other than
    /// loopback need TLS with client certificates (--tls-cert, --tls-key, --tls-client-ca).
    #[arg(long)]
    tcp: Option<SocketAddr>,
    /// Require TLS (NBD STARTTLS) on every listener, with this certificate chain (PEM).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Control socket for `flashraid status` and `flashraid fail` (default:
    /// /run/flashraid/NAME.control).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Export read-only.
    #[arg(long)]
    read_only: bool,
    /// Only the array with this name (the export's name is the array's).
    #[arg(long)]
    name: Option<String>,
    /// Reactor threads (default: one per CPU).
    #[arg(long)]
    shards: Option<u32>,
    /// Start a dirty, degraded array (see the refusal message for what that risks).
    #[arg(long)]
    force: bool,
    /// Instead of member devices: a new array on this many in-memory members (for
    /// benchmarks and trials; its data is gone when the server stops), e.g. `--memory 8x256M`.
    #[arg(long, value_name = "COUNTxSIZE", conflicts_with = "members")]
    memory: Option<String>,
    /// RAID level of a `--memory` array.
    #[arg(long, default_value = "6", requires = "memory")]
    level: flashraid_layout::Level,
    /// Chunk size of a `--memory` array, KiB.
    #[arg(long, default_value_t = 16, requires = "memory")]
    chunk_kib: u64,
    /// The array's members.
    #[arg(required_unless_present = "memory")]
    members: Vec<PathBuf>,
}

/// A socket file left by a server that is gone may be replaced; a live one may not.
fn unix_listener(path: &Path) -> Result<UnixListener> {
    if path.exists() {
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::symlink_metadata(path)?.file_type();
        if !kind.is_socket() {
            bail!("{} exists and is not a socket: refusing to replace it", path.display());
        }
        if UnixStream::connect(path).is_ok() {
            bail!("{}: another server is listening there", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

/// A fresh array on in-memory members: `COUNTxSIZE`.
fn memory_array(spec: &str, args: &ServeArgs, options: &OpenOptions) -> Result<Array> {
    let (count, size) = spec
        .split_once('x')
        .with_context(|| format!("--memory {spec:?}: expected COUNTxSIZE, e.g. 8x256M"))?;
    let count: usize = count.parse().with_context(|| format!("--memory: bad count {count:?}"))?;
    let size = crate::array_cmds::parse_size(size).map_err(|e| anyhow::anyhow!("--memory: {e}"))?;
    let members: Vec<_> = (0..count)
        .map(|i| flashraid_runtime::MemMember::new(&format!("memory{i}"), size))
        .collect();
    let create = flashraid_runtime::CreateSpec {
        name: args.name.clone().unwrap_or_else(|| "memory".to_string()),
        level: args.level,
        chunk_bytes: args.chunk_kib << 10,
        members: vec![],
        spares: vec![],
        create_files_bytes: None,
        overwrite: flashraid_control::Overwrite::Refuse,
        init: None,
        bitmap_region_bytes: None,
        shards: options
            .shards
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
    };
    flashraid_runtime::create_in_memory(&create, &members)?;
    Array::open_in_memory(&members, options).context("cannot start the in-memory array")
}

pub fn run_serve(args: ServeArgs) -> Result<()> {
    if args.socket.is_none() && args.tcp.is_none() {
        bail!("give --socket PATH, --tcp ADDR, or both");
    }
    if let Some(addr) = args.tcp
        && !addr.ip().is_loopback()
        && args.tls_client_ca.is_none()
    {
        bail!(
            "{addr} is not a loopback address: serving beyond this machine needs TLS with \
             client certificates (--tls-cert, --tls-key and --tls-client-ca)"
        );
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            flashraid_nbd::tls::load(cert, key, args.tls_client_ca.as_deref())
                .context("cannot set up TLS")?,
        ),
        _ => None,
    };
    let signals = flashraid_nbd::signals::StopSignals::block();
    let mut options = OpenOptions::recommended();
    options.name = args.name.clone();
    if args.shards.is_some() {
        options.shards = args.shards;
    }
    if args.force {
        options.dirty_degraded = flashraid_format::assembly::DirtyDegraded::Force;
    }
    let array = match &args.memory {
        None => Array::open(&args.members, &options).context("cannot start the array")?,
        Some(spec) => memory_array(spec, &args, &options)?,
    };
    let array = Arc::new(array);
    let status = array.status()?;
    let mut listeners = vec![];
    if let Some(path) = &args.socket {
        listeners.push(Listener::Unix(unix_listener(path)?));
    }
    if let Some(addr) = args.tcp {
        let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        listeners.push(Listener::Tcp(l));
    }
    let control_path =
        args.control.clone().unwrap_or_else(|| crate::control::default_control_path(&status.name));
    let control_listener = crate::control::bind(&control_path)?;
    let tls_note = match &tls {
        None => "",
        Some(t) if t.client_certificates => " (TLS required, client certificates checked)",
        Some(_) => " (TLS required)",
    };
    let export = ExportConfig { name: status.name.clone(), read_only: args.read_only, tls };
    let server = Arc::new(Server::start(array.clone(), export, listeners)?);
    let control_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let control_thread = {
        let context = crate::control::ControlContext {
            array: array.clone(),
            connections: {
                let server = server.clone();
                Box::new(move || server.connections())
            },
            exports: vec![status.name.clone()],
        };
        let stop = control_stop.clone();
        std::thread::Builder::new()
            .name("flashraid-control-socket".into())
            .spawn(move || crate::control::serve(control_listener, context, stop))?
    };
    println!(
        "serving array {:?} ({}, {}, {} members{}) as export {:?}{}",
        status.name,
        status.level,
        crate::array_cmds::human(status.array_bytes),
        status.members.len(),
        if status.degraded { ", DEGRADED" } else { "" },
        status.name,
        if args.read_only { " read-only" } else { "" },
    );
    let scheme = if tls_note.is_empty() { "nbd" } else { "nbds" };
    if let Some(path) = &args.socket {
        println!("  unix: {scheme}+unix:///{}?socket={}{tls_note}", status.name, path.display());
    }
    if let Some(addr) = args.tcp {
        println!("  tcp:  {scheme}://{addr}/{}{tls_note}", status.name);
    }
    println!("  control: {} (flashraid status, flashraid fail)", control_path.display());
    println!(
        "SIGTERM or Ctrl-C stops: in-flight IO finishes, the array is flushed and marked clean."
    );
    let signal = signals.wait();
    eprintln!(
        "flashraid serve: signal {signal}: draining connections (a second signal exits at once)"
    );
    std::thread::spawn(move || {
        signals.wait();
        eprintln!(
            "flashraid serve: second signal: exiting now; the array stays dirty and its \
             write-intent bitmap is resynced at the next start"
        );
        std::process::exit(1);
    });
    server.stop();
    control_stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = control_thread.join();
    let _ = std::fs::remove_file(&control_path);
    Arc::try_unwrap(server).map_err(|_| anyhow::anyhow!("the server is still referenced"))?.join();
    if let Some(path) = &args.socket {
        let _ = std::fs::remove_file(path);
    }
    let array =
        Arc::try_unwrap(array).map_err(|_| anyhow::anyhow!("connections still hold the array"))?;
    match array.shutdown()? {
        Stopped::Clean => eprintln!("flashraid serve: array stopped clean"),
        Stopped::Dirty => {
            eprintln!("flashraid serve: array stopped dirty: the next start resyncs it")
        }
    }
    Ok(())
}
