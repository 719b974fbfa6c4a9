//! `flashraid serve`: assemble arrays from their members (given on the command line, grouped
//! by the array UUID in their superblocks, or listed in a config file) and export each over
//! NBD by its name until SIGTERM or SIGINT; then drain, flush, mark them clean and exit.
//!
//! One array of several stops alone (`flashraid stop`, the control socket's `stop-array`):
//! each array has its own reactors, controller and members, and shares only the NBD
//! listeners and this process with the others, so its stop is theirs in miniature: its
//! export withdrawn (no new client reaches it; its connections drained), the array flushed
//! and marked clean (`Array::shutdown_in_place`: its control socket's other handlers still
//! hold it), its control socket removed; the others serve on. The last array left stops
//! the server instead (SIGTERM's path). Array stops are taken one at a time (`Served`'s
//! lock), so two at once never leave a server that serves nothing.
//!
//! Another array starts in a running server (`flashraid start`, the control socket's
//! `start-array`): assembled from its members with the server's settings, its control
//! socket made in the server's control directory, its export offered on the server's
//! listeners. Starts are taken under the same lock as array stops, and refused once the
//! whole server is stopping, so every array the server ever started is stopped by it.

use crate::control::{ArrayStarted, ArrayStop, StartArray};
use anyhow::{Context, Result, bail};
use clap::Args;
use flashraid_nbd::{Export, ExportConfig, Listener, ServedExports, Server, Withdrawal};
use flashraid_runtime::{Array, ArrayStatus, OpenOptions, Stopped};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Unix socket to listen on (nbd+unix:///NAME?socket=PATH).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also listen on TCP at this address, e.g. 127.0.0.1:10809. Addresses other than
    /// loopback need TLS with client certificates (--tls-cert, --tls-key, --tls-client-ca).
    #[arg(long)]
    tcp: Option<SocketAddr>,
    /// Serve --tcp beyond loopback without TLS: anyone who reaches the address can read and
    /// overwrite the array. For isolated benchmark networks whose clients cannot do TLS
    /// with client certificates (fio's nbd engine, as `flashraid bench run --load-host`).
    #[arg(long)]
    insecure_tcp: bool,
    /// Require TLS (NBD STARTTLS) on every listener, with this certificate chain (PEM).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Control socket for `flashraid status` and `flashraid fail` (one array only; default:
    /// CONTROL_DIR/NAME.control). Takes the place of --control-dir.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Directory for the arrays' control sockets, NAME.control each (default:
    /// $FLASHRAID_CONTROL_DIR if set and not empty, else /run/flashraid). The commands that
    /// reach a server look there when FLASHRAID_CONTROL_DIR names it too.
    #[arg(long)]
    control_dir: Option<PathBuf>,
    /// Serve read-only, like `mdadm --assemble --readonly`: nothing is written to any member
    /// (members opened read-only; no superblock or bitmap update at start or stop; no resync,
    /// rebuild, spare takeover or repair scrub; NBD writes and commands that change the array
    /// are refused). `flashraid scrub` (a check) runs and writes nothing: read errors it
    /// meets are reported, not rewritten. A dirty, degraded array still needs --force;
    /// reads that would reconstruct a region left dirty then fail.
    #[arg(long)]
    read_only: bool,
    /// Serve each connection on a thread of its own after the handshake (as TLS connections
    /// always are). By default a connection runs inside a reactor, with no thread between
    /// its socket and the engine: fewer threads share the cores, and on two cores 4k
    /// random IO no longer falls into slow runs (docs/PERFORMANCE.md).
    #[arg(long)]
    connection_threads: bool,
    /// Only the array with this name (exports are named after their arrays); with --memory,
    /// the new array's name.
    #[arg(long)]
    name: Option<String>,
    /// Arrays to serve, one per line: `NAME MEMBER...` (lines starting with `#` are
    /// comments). Instead of members on the command line.
    #[arg(long, conflicts_with_all = ["members", "memory", "name"])]
    config: Option<PathBuf>,
    /// KiB of every member each shard's run of neighbouring stripes covers (default 0: one
    /// stripe). Longer runs let neighbouring chunks of large requests be merged into one
    /// member IO while the members are busy; see docs/PERFORMANCE.md before raising it.
    /// Not stored with the array.
    #[arg(long, value_name = "KIB", default_value_t = 0)]
    stripe_run_kib: u64,
    /// Start a dirty, degraded array (see the refusal message for what that risks).
    #[arg(long)]
    force: bool,
    /// Tunables, stored with each array served (the next start uses them too).
    #[command(flatten)]
    tunables: crate::array_cmds::TunableArgs,
    /// A shell command to run on every event of an array (member failed, spare took over,
    /// rebuild finished, scrub found mismatches, ...), like mdadm's PROGRAM: FLASHRAID_EVENT,
    /// FLASHRAID_ARRAY and FLASHRAID_MESSAGE are set.
    #[arg(long, value_name = "COMMAND")]
    on_event: Option<String>,
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
    /// Members of the arrays to serve (several arrays: each is found by the array UUID in
    /// its members' superblocks).
    #[arg(required_unless_present_any = ["memory", "config"])]
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
    let shards = args
        .tunables
        .shards
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    let name = args.name.clone().unwrap_or_else(|| "memory".to_string());
    let create =
        flashraid_runtime::CreateSpec::in_memory(&name, args.level, args.chunk_kib << 10, shards);
    flashraid_runtime::create_in_memory(&create, &members)?;
    Array::open_in_memory(&members, options).context("cannot start the in-memory array")
}

/// The arrays to serve: (name, member paths).
fn arrays_to_start(args: &ServeArgs) -> Result<Vec<(String, Vec<PathBuf>)>> {
    let arrays = if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut arrays: Vec<(String, Vec<PathBuf>)> = vec![];
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            // Whole-line comments only: '#' may appear in a path.
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let name = words.next().expect("a non-empty line has a word");
            let members: Vec<PathBuf> = words.map(PathBuf::from).collect();
            if members.is_empty() {
                bail!("{}:{}: array {name:?} lists no members", path.display(), number + 1);
            }
            arrays.push((name.to_string(), members));
        }
        if arrays.is_empty() {
            bail!("{}: no array listed (lines: NAME MEMBER...)", path.display());
        }
        arrays
    } else {
        arrays_of(&args.members, args.name.as_deref())?
    };
    for (i, (name, _)) in arrays.iter().enumerate() {
        if arrays[..i].iter().any(|(n, _)| n == name) {
            bail!("array {name:?} is listed twice");
        }
    }
    Ok(arrays)
}

/// Members grouped into arrays, one per array UUID in their superblocks (with `only`, the
/// array of that name alone): (name, member paths).
fn arrays_of(members: &[PathBuf], only: Option<&str>) -> Result<Vec<(String, Vec<PathBuf>)>> {
    {
        let mut groups: Vec<(flashraid_format::Uuid, String, Vec<PathBuf>)> = vec![];
        for path in members {
            let (_, copies) = flashraid_runtime::inspect(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let newest = copies.iter().flatten().max_by_key(|sb| sb.event).with_context(|| {
                format!(
                    "{}: no valid flashraid superblock (see `flashraid inspect`)",
                    path.display()
                )
            })?;
            match groups.iter_mut().find(|(uuid, _, _)| *uuid == newest.array_uuid) {
                Some((_, _, members)) => members.push(path.clone()),
                None => {
                    groups.push((newest.array_uuid, newest.array_name.clone(), vec![path.clone()]))
                }
            }
        }
        if let Some(only) = only {
            groups.retain(|(_, name, _)| name == only);
            if groups.is_empty() {
                bail!("no member given belongs to an array named {only:?}");
            }
        }
        // Two arrays with one name (an old disk of a re-created array, say) cannot both be
        // exported by that name: refuse, naming them, before anything starts.
        for (i, (uuid, name, members)) in groups.iter().enumerate() {
            if let Some((other, _, others)) = groups[..i].iter().find(|(_, n, _)| n == name) {
                bail!(
                    "two different arrays are both named {name:?}: {other} on {} and {uuid} on \
                     {}; give the members of one (or --name with other names)",
                    others[0].display(),
                    members[0].display()
                );
            }
        }
        Ok(groups.into_iter().map(|(_, name, members)| (name, members)).collect())
    }
}

/// Socket files this server created, removed when it ends (also on an early error). An
/// array stopped alone takes its control socket's path out first (`remove`): a server
/// started for that array afterwards may have bound the same path, and this one's exit must
/// not remove that server's socket.
struct SocketFiles(Mutex<Vec<PathBuf>>);

impl SocketFiles {
    fn add(&self, path: PathBuf) {
        self.0.lock().expect("not poisoned").push(path);
    }

    /// Remove `path` now, and forget it.
    fn remove(&self, path: &Path) {
        self.0.lock().expect("not poisoned").retain(|p| p != path);
        let _ = std::fs::remove_file(path);
    }
}

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in self.0.lock().expect("not poisoned").iter() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// An array the server serves, with its control socket.
struct ServedArray {
    name: String,
    array: Arc<Array>,
    control_path: PathBuf,
    /// Ends this array's control socket thread (an array stopped alone).
    control_stop: Arc<AtomicBool>,
}

/// The arrays a running server serves now, shared by the control sockets: an array stopped
/// alone leaves the list. Its lock is held for a whole array stop: stops are taken one at a
/// time, so the last array left is always known (and stops the server instead).
struct Served {
    arrays: Mutex<Vec<ServedArray>>,
    /// Held for a whole `start_array`: starts are taken one at a time, so two starts of the
    /// same members never assemble it twice. A start holds `arrays` only to check names and
    /// to list what it started, not through its assembly, so a stop or the server's end
    /// does not wait for an assembly (and a start that finds the server stopping when it
    /// comes to list its array stops it again).
    starting: Mutex<()>,
    exports: ServedExports,
    sockets: Arc<SocketFiles>,
    /// How this server opens an array (its command line's settings), for arrays started
    /// while it runs.
    options: OpenOptions,
    read_only: bool,
    /// Where the control sockets of arrays started while it runs go.
    control_dir: PathBuf,
    /// Connections open on the NBD server.
    connection_count: Arc<AtomicUsize>,
    /// Set by the first stop of the whole server (signal or `stop --all`).
    stopping: Arc<AtomicBool>,
    /// The control socket threads, joined when the server ends (arrays started while it
    /// runs add theirs).
    controls: Mutex<Vec<JoinHandle<()>>>,
    /// How clients reach an export, for the log.
    reach: Reach,
}

/// The listeners' addresses, as the log names them.
struct Reach {
    socket: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    scheme: &'static str,
    tls_note: &'static str,
}

impl Served {
    /// Stop array `name` alone (see the module); returns once it has stopped.
    fn stop_array(&self, name: &str, how: Withdrawal) -> ArrayStop {
        let mut arrays = self.arrays.lock().expect("not poisoned");
        let Some(index) = arrays.iter().position(|a| a.name == name) else {
            return ArrayStop::NotServed;
        };
        if arrays.len() == 1 {
            return ArrayStop::OnlyArray;
        }
        match self.exports.withdraw(name, how) {
            Ok(export) => drop(export),
            Err(flashraid_nbd::WithdrawError::InUse(connections)) => {
                return ArrayStop::InUse(connections);
            }
            Err(flashraid_nbd::WithdrawError::Unknown(_)) => return ArrayStop::NotServed,
        }
        let stopping = arrays.remove(index);
        let serving: Vec<String> = arrays.iter().map(|a| a.name.clone()).collect();
        eprintln!(
            "flashraid serve: array {name:?}: stopping it alone (connections drained); \
             serving on: {}",
            serving.join(", ")
        );
        let result = stopping.array.shutdown_in_place();
        report_stopped(name, &result.as_ref().map(|s| *s).map_err(|e| anyhow::anyhow!("{e}")));
        // Its socket goes before the reply: once `flashraid stop` returns, a new server of
        // the array can bind the same path.
        self.sockets.remove(&stopping.control_path);
        stopping.control_stop.store(true, Ordering::SeqCst);
        ArrayStop::Stopped { result: result.map_err(|e| e.to_string()), serving }
    }
}

/// Start the array `request` names in the running server and serve it beside the others
/// (see the module). Nothing is left behind when it fails: no control socket, no export,
/// and the array, if it had started, stopped again.
fn start_array(served: &Arc<Served>, request: StartArray) -> Result<ArrayStarted, String> {
    const STOPPING: &str = "the server is stopping: start the array in a new server";
    let _one_start = served.starting.lock().expect("not poisoned");
    if served.stopping.load(Ordering::SeqCst) {
        return Err(STOPPING.into());
    }
    let groups =
        arrays_of(&request.members, request.name.as_deref()).map_err(|e| format!("{e:#}"))?;
    let (name, members) = match groups.as_slice() {
        [one] => one.clone(),
        several => {
            let names: Vec<&str> = several.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "the members given belong to {} arrays ({}): start one at a time (--name)",
                several.len(),
                names.join(", ")
            ));
        }
    };
    let served_already = |arrays: &[ServedArray]| {
        arrays.iter().any(|a| a.name == name) || served.exports.names().contains(&name)
    };
    // Checked before the assembly, which would fail on members an array of this server
    // holds open (and lock them), and again when listing; between the two only a stop can
    // change the list, and a stop only takes names out.
    if served_already(&served.arrays.lock().expect("not poisoned")) {
        return Err(format!("array {name:?} is served already by this server"));
    }
    let control_path = crate::control::control_path_in(&served.control_dir, &name)
        .map_err(|e| format!("{e:#}"))?;
    let listener = crate::control::bind(&control_path).map_err(|e| format!("{e:#}"))?;
    served.sockets.add(control_path.clone());
    let mut options = served.options.clone();
    options.name = Some(name.clone());
    if request.force {
        options.dirty_degraded = flashraid_format::assembly::DirtyDegraded::Force;
        options.stale_members = flashraid_format::assembly::StaleMembers::UseIfNeeded;
    }
    let array = match Array::open(&members, &options) {
        Ok(array) => Arc::new(array),
        Err(e) => {
            served.sockets.remove(&control_path);
            return Err(format!("cannot start array {name:?}: {e:#}"));
        }
    };
    let undo = |array: Arc<Array>, why: String| {
        served.sockets.remove(&control_path);
        let _ = shut_down(vec![(name.clone(), array)]);
        Err(why)
    };
    let status = match array.status() {
        Ok(status) => status,
        Err(e) => return undo(array, format!("array {name:?} started but has no status: {e}")),
    };
    let mut arrays = served.arrays.lock().expect("not poisoned");
    // The server's end sets `stopping` before it takes the list: a start that sees it clear
    // here lists its array before the end takes the list, and the end stops it with the rest.
    if served.stopping.load(Ordering::SeqCst) {
        drop(arrays);
        return undo(array, STOPPING.into());
    }
    assert!(!served_already(&arrays), "array {name:?} listed while its start held `starting`");
    let export = Export { name: name.clone(), read_only: served.read_only, array: array.clone() };
    if let Err(e) = served.exports.offer(export) {
        drop(arrays);
        return undo(array, e.to_string());
    }
    let control_stop = Arc::new(AtomicBool::new(false));
    arrays.push(ServedArray {
        name: name.clone(),
        array: array.clone(),
        control_path: control_path.clone(),
        control_stop: control_stop.clone(),
    });
    // Under the lock: the server's end joins every control thread it finds listed.
    spawn_control(served, name.clone(), array, control_stop, listener);
    let serving: Vec<String> = arrays.iter().map(|a| a.name.clone()).collect();
    drop(arrays);
    eprintln!("flashraid serve: array {name:?} started in the running server");
    print_serving(&status, &control_path, &served.reach, served.read_only);
    let mut notes = vec![];
    if status.degraded {
        notes.push("DEGRADED".to_string());
    }
    if status.resyncing {
        notes.push("resyncing regions an unclean stop left dirty".to_string());
    }
    Ok(ArrayStarted { name, control: control_path, serving, notes })
}

/// Serve array `name`'s control socket on a thread of its own (listed in `served.controls`).
fn spawn_control(
    served: &Arc<Served>,
    name: String,
    array: Arc<Array>,
    stop: Arc<AtomicBool>,
    listener: std::os::unix::net::UnixListener,
) {
    let context = crate::control::ControlContext {
        name: name.clone(),
        array,
        connections: {
            let count = served.connection_count.clone();
            Box::new(move || count.load(Ordering::SeqCst))
        },
        array_connections: Box::new({
            let exports = served.exports.clone();
            let name = name.clone();
            move || exports.connections(&name).unwrap_or(0)
        }),
        exports: Box::new({
            let exports = served.exports.clone();
            move || exports.names()
        }),
        request_stop: Box::new({
            let stopping = served.stopping.clone();
            move || {
                if !stopping.swap(true, Ordering::SeqCst) {
                    flashraid_nbd::signals::raise_stop();
                }
            }
        }),
        stop_array: Box::new({
            let served = served.clone();
            move |how| {
                // The whole server is stopping (found by review: the reply said the
                // others serve on while the server exited).
                if served.stopping.load(Ordering::SeqCst) {
                    return ArrayStop::ServerStopping;
                }
                served.stop_array(&name, how)
            }
        }),
        start_array: Box::new({
            let served = served.clone();
            move |request| start_array(&served, request)
        }),
    };
    let thread = std::thread::Builder::new()
        .name("flashraid-control-socket".into())
        .spawn(move || crate::control::serve(listener, context, stop))
        .expect("a thread for the control socket");
    served.controls.lock().expect("not poisoned").push(thread);
}

/// Say how clients reach the array `status` describes (the server's log).
fn print_serving(status: &ArrayStatus, control: &Path, reach: &Reach, read_only: bool) {
    let (scheme, tls_note) = (reach.scheme, reach.tls_note);
    println!(
        "serving array {:?} ({}, {}, {} members{}) as export {:?}{}",
        status.name,
        status.level,
        crate::array_cmds::human(status.array_bytes),
        status.members.len(),
        if status.degraded { ", DEGRADED" } else { "" },
        status.name,
        if read_only { " read-only" } else { "" },
    );
    if let Some(path) = &reach.socket {
        println!("  unix: {scheme}+unix:///{}?socket={}{tls_note}", status.name, path.display());
    }
    if let Some(addr) = reach.tcp {
        println!("  tcp:  {scheme}://{addr}/{}{tls_note}", status.name);
    }
    println!("  control: {} (flashraid status, flashraid fail, flashraid stop)", control.display());
}

/// Say in the server's log how array `name` stopped.
fn report_stopped(name: &str, result: &Result<Stopped>) {
    match result {
        Ok(Stopped::Clean) => eprintln!("flashraid serve: array {name:?} stopped clean"),
        Ok(Stopped::Dirty) => {
            eprintln!("flashraid serve: array {name:?} stopped dirty: the next start resyncs it")
        }
        Ok(Stopped::Untouched) => eprintln!(
            "flashraid serve: array {name:?} stopped; it was served read-only and nothing \
             was written to its members"
        ),
        Err(e) => eprintln!("flashraid serve: array {name:?}: {e:#}"),
    }
}

/// Stop arrays that were started, cleanly, reporting each; the first error is returned.
fn shut_down(arrays: Vec<(String, Arc<Array>)>) -> Result<()> {
    let mut first_error = None;
    for (name, array) in arrays {
        let result = match Arc::try_unwrap(array) {
            Ok(array) => array.shutdown().map_err(anyhow::Error::from),
            Err(_) => Err(anyhow::anyhow!("array {name:?} is still in use")),
        };
        report_stopped(&name, &result);
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

pub fn run_serve(args: ServeArgs) -> Result<()> {
    if args.socket.is_none() && args.tcp.is_none() {
        bail!("give --socket PATH, --tcp ADDR, or both");
    }
    if let Some(addr) = args.tcp
        && !addr.ip().is_loopback()
        && args.tls_client_ca.is_none()
    {
        if !args.insecure_tcp {
            bail!(
                "{addr} is not a loopback address: serving beyond this machine needs TLS with \
                 client certificates (--tls-cert, --tls-key and --tls-client-ca), or \
                 --insecure-tcp on a network where anyone who reaches it may write the array"
            );
        }
        let how = if args.tls_cert.is_some() {
            "with TLS but without client certificates"
        } else {
            "in plain text without authentication"
        };
        eprintln!(
            "flashraid serve: WARNING: serving {addr} {how} (--insecure-tcp): anyone who \
             reaches it can read and overwrite the array"
        );
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            flashraid_nbd::tls::load(cert, key, args.tls_client_ca.as_deref())
                .context("cannot set up TLS")?,
        ),
        _ => None,
    };
    // Everything that can fail without touching an array comes first: an array started and
    // then dropped by an error would be left dirty (and, if degraded, refuse to start
    // without --force).
    let plan: Vec<(String, Vec<PathBuf>)> = match &args.memory {
        Some(_) => vec![(args.name.clone().unwrap_or_else(|| "memory".to_string()), vec![])],
        None => arrays_to_start(&args)?,
    };
    if args.control.is_some() && plan.len() > 1 {
        bail!("--control names one socket; with several arrays use --control-dir");
    }
    let sockets = Arc::new(SocketFiles(Mutex::new(vec![])));
    let mut listeners = vec![];
    if let Some(path) = &args.socket {
        listeners.push(Listener::Unix(unix_listener(path)?));
        sockets.add(path.clone());
    }
    if let Some(addr) = args.tcp {
        let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
        listeners.push(Listener::Tcp(l));
    }
    // Control sockets exist before the first client can connect, so a script that sees the
    // export can ask for its status at once.
    let mut control_listeners = vec![];
    for (name, _) in &plan {
        let path = match &args.control {
            Some(path) => path.clone(),
            None => {
                let dir = args.control_dir.clone().unwrap_or_else(crate::control::control_dir);
                crate::control::control_path_in(&dir, name)?
            }
        };
        control_listeners.push((crate::control::bind(&path)?, path.clone()));
        sockets.add(path);
    }
    let signals = flashraid_nbd::signals::StopSignals::block();
    let mut options = OpenOptions::recommended();
    options.config.stripe_run_member_bytes = args.stripe_run_kib << 10;
    if args.force {
        options.dirty_degraded = flashraid_format::assembly::DirtyDegraded::Force;
        options.stale_members = flashraid_format::assembly::StaleMembers::UseIfNeeded;
    }
    options.event_command = args.on_event.clone();
    if args.read_only {
        options.access = flashraid_engine::ArrayAccess::ReadOnly;
    }
    options.tunables = args.tunables.to_tunables();
    let mut arrays: Vec<(String, Arc<Array>)> = vec![];
    for (name, members) in &plan {
        let opened = match &args.memory {
            Some(spec) => memory_array(spec, &args, &options),
            None => {
                let mut options = options.clone();
                options.name = Some(name.clone());
                Array::open(members, &options)
                    .with_context(|| format!("cannot start array {name:?}"))
            }
        };
        match opened {
            Ok(array) => arrays.push((name.clone(), Arc::new(array))),
            Err(e) => {
                // Leave the ones already started clean.
                let _ = shut_down(arrays);
                return Err(e);
            }
        }
    }
    let statuses: Vec<ArrayStatus> = match arrays.iter().map(|(_, a)| a.status()).collect() {
        Ok(s) => s,
        Err(e) => {
            let _ = shut_down(arrays);
            return Err(e.into());
        }
    };
    let tls_note = match &tls {
        None => "",
        Some(t) if t.client_certificates => " (TLS required, client certificates checked)",
        Some(_) => " (TLS required)",
    };
    let exports = ExportConfig {
        exports: arrays
            .iter()
            .map(|(name, array)| Export {
                name: name.clone(),
                read_only: args.read_only,
                array: array.clone(),
            })
            .collect(),
        tls,
        connection_threads: args.connection_threads,
    };
    let server = match Server::start(exports, listeners) {
        Ok(server) => server,
        Err(e) => {
            let _ = shut_down(arrays);
            return Err(e.into());
        }
    };
    let scheme = if tls_note.is_empty() { "nbd" } else { "nbds" };
    let served = Arc::new(Served {
        starting: Mutex::new(()),
        arrays: Mutex::new(
            arrays
                .iter()
                .zip(&control_listeners)
                .map(|((name, array), (_, path))| ServedArray {
                    name: name.clone(),
                    array: array.clone(),
                    control_path: path.clone(),
                    control_stop: Arc::new(AtomicBool::new(false)),
                })
                .collect(),
        ),
        exports: server.exports(),
        sockets: sockets.clone(),
        options,
        read_only: args.read_only,
        // Beside the one `--control` names, if given (a directory this server can write);
        // absolute, since the `start` reply names the socket to a client elsewhere.
        control_dir: {
            let dir = args
                .control_dir
                .clone()
                .or_else(|| args.control.as_ref().and_then(|p| p.parent()).map(Path::to_path_buf))
                .unwrap_or_else(crate::control::control_dir);
            // (`--control a.control`: its parent is "", the working directory.)
            let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
            std::path::absolute(&dir).unwrap_or(dir)
        },
        connection_count: server.connection_counter(),
        // Set by the first stop, by signal or by `flashraid stop`: a later `stop` raises no
        // second SIGTERM, which would take the exit-at-once path and leave the arrays dirty
        // (found by review: two `stop`s in a row did).
        stopping: Arc::new(AtomicBool::new(false)),
        controls: Mutex::new(vec![]),
        reach: Reach { socket: args.socket.clone(), tcp: args.tcp, scheme, tls_note },
    });
    // The list holds the arrays from now on (`shut_down` takes what is left of it).
    drop(arrays);
    let started: Vec<(String, Arc<Array>, Arc<AtomicBool>)> = served
        .arrays
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|a| (a.name.clone(), a.array.clone(), a.control_stop.clone()))
        .collect();
    for ((name, array, stop), (listener, _)) in started.into_iter().zip(control_listeners) {
        spawn_control(&served, name, array, stop, listener);
    }
    let paths: Vec<PathBuf> = served
        .arrays
        .lock()
        .expect("not poisoned")
        .iter()
        .map(|a| a.control_path.clone())
        .collect();
    for (status, control) in statuses.iter().zip(&paths) {
        print_serving(status, control, &served.reach, args.read_only);
    }
    if args.read_only {
        println!("SIGTERM or Ctrl-C stops: in-flight IO finishes; nothing is written.");
    } else {
        println!(
            "SIGTERM or Ctrl-C stops: in-flight IO finishes, the arrays are flushed and marked \
             clean."
        );
    }
    let signal = signals.wait();
    // From now on no array starts in this server (`start_array` checks under the list's
    // lock, which the end below takes).
    served.stopping.store(true, Ordering::SeqCst);
    eprintln!(
        "flashraid serve: signal {signal}: draining connections (a second signal exits at once)"
    );
    std::thread::spawn(move || {
        signals.wait();
        eprintln!(
            "flashraid serve: second signal: exiting now; the arrays stay dirty and their \
             write-intent bitmaps are resynced at the next start"
        );
        std::process::exit(1);
    });
    server.stop();
    // The control sockets answer `status` while connections drain; they stop after (an
    // array stop in progress finishes first: its handler is joined with its socket).
    server.join();
    let left: Vec<ServedArray> = std::mem::take(&mut *served.arrays.lock().expect("not poisoned"));
    for array in &left {
        array.control_stop.store(true, Ordering::SeqCst);
    }
    // Every array started is in `left` (a start lists its array and its control thread
    // under the list's lock, and only while `stopping` is clear; one still assembling stops
    // its array again), so every control thread is here too.
    let controls = std::mem::take(&mut *served.controls.lock().expect("not poisoned"));
    for thread in controls {
        let _ = thread.join();
    }
    // Every control thread has ended; so has any array stop (its lock is free).
    let arrays: Vec<(String, Arc<Array>)> = left.into_iter().map(|a| (a.name, a.array)).collect();
    drop(served);
    drop(sockets);
    shut_down(arrays)
}
