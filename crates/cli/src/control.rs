//! The control socket of `flashraid serve`, and the commands that talk to it (`status`,
//! `fail`, `stop`, `rebuild`, `tune`, `scrub`, `spare`, `replace`).
//!
//! Protocol: a client connects to the Unix socket, sends one line (`status`, `fail ROLE`,
//! `stop`, `stop-array`, ...), and reads one line of JSON back; then the server closes. One
//! line each way keeps it scriptable with `socat` as well as with the CLI. Requests are bounded
//! (`COMMAND_BYTES_MAX`); the control path is never on the data path.
//!
//! Concurrency: one thread accepts, and each connection is served on a thread of its own,
//! at most `CONTROL_CONNECTIONS_MAX` at once (one more is answered that the socket is busy,
//! and closed). So a client that connects and sends nothing (a `socat` left open) holds only
//! its own thread, for at most `COMMAND_WAIT_MS_MAX`, and `status` answers meanwhile. The
//! handlers share nothing but the `Arc<Array>`, whose commands the controller thread takes
//! one at a time from its channel. The stop flag is looked at every `STOP_POLL_MS` by the
//! accepting thread and by each connection still waiting for its command line; `serve`
//! returns only once every connection's thread has ended, so no handler holds the array
//! when the server shuts it down.
//!
//! The socket is created mode 0600 (only the owner, normally root, may fail members).

use anyhow::{Context, Result, bail};
use clap::Args;
use flashraid_control::Overwrite;
use flashraid_nbd::Withdrawal;
use flashraid_runtime::{
    Array, ArrayStatus, FailGuard, ReAdd, Stopped, Tunable, stored_rate_bytes_per_s,
};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest command line accepted (its newline included): room for two paths of PATH_MAX
/// (4096 bytes) and their JSON escapes. A longer line is refused whole, never cut (found
/// by review: a line cut at 4096 bytes was carried out, on a device whose path was the cut
/// one).
const COMMAND_BYTES_MAX: usize = 32 << 10;
/// Control connections served at once, each on its own thread; one more is told the socket
/// is busy. Enough for an admin's commands beside a few forgotten idle clients, few enough
/// that a client opening connections in a loop cannot make the server start many threads.
pub const CONTROL_CONNECTIONS_MAX: usize = 16;
/// How long a connection may take to send its command line before it is closed.
const COMMAND_WAIT_MS_MAX: u64 = 5000;
/// How long a reply may wait for a client that does not read it.
const REPLY_WAIT_MS_MAX: u64 = 5000;
/// How often the accepting thread, and a connection waiting for its command, look at the
/// stop flag: the bound on how long a stop waits for an idle client.
const STOP_POLL_MS: u64 = 50;
/// How long `flashraid stop` of one array waits for its reply when `--wait-s 0`: long
/// enough for a refusal (clients connected), which comes at once; the stop's own reply
/// comes once the array has stopped (connections drained, flushed, marked clean).
const ARRAY_STOP_REFUSAL_WAIT: Duration = Duration::from_secs(2);
/// Where control sockets go unless `--control` says otherwise.
pub const CONTROL_DIR: &str = "/run/flashraid";

/// Sets the directory of control sockets for `serve` and for every command that reaches a
/// server, instead of `CONTROL_DIR` (found by review: after `serve --control-dir X`, every
/// command needed `--control X/NAME.control`).
pub const CONTROL_DIR_ENV: &str = "FLASHRAID_CONTROL_DIR";

/// Where the commands look for control sockets, and `serve` makes them unless told:
/// `$FLASHRAID_CONTROL_DIR` (an empty value counts as unset), else `CONTROL_DIR`.
pub fn control_dir() -> PathBuf {
    std::env::var_os(CONTROL_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(CONTROL_DIR), PathBuf::from)
}

pub fn default_control_path(array_name: &str) -> Result<PathBuf> {
    control_path_in(&control_dir(), array_name)
}

/// The control socket of array `array_name` in `dir`: `dir/NAME.control`, never a path
/// outside `dir`. `create` refuses names with a `/` or a NUL, but an array made by an older
/// version may hold one (`../x` would put the socket in the parent directory, `a/b` in a
/// subdirectory, `/x` would replace `dir` altogether): refused, naming `--control`.
pub fn control_path_in(dir: &Path, array_name: &str) -> Result<PathBuf> {
    let file = format!("{array_name}.control");
    let path = dir.join(&file);
    let in_dir = !array_name.contains(['/', '\0'])
        && path.parent() == Some(dir)
        && path.file_name() == Some(std::ffi::OsStr::new(&file));
    if !in_dir {
        bail!(
            "array name {array_name:?} cannot name a control socket in {}: NAME.control would \
             not be a file there. Give the socket's path with --control PATH (one array per \
             serve)",
            dir.display()
        );
    }
    Ok(path)
}

/// What the control thread needs besides the array.
pub struct ControlContext {
    /// The array's name (its export's): the reply to `stop-array` names it after the
    /// array has stopped, when the array no longer answers.
    pub name: String,
    pub array: Arc<Array>,
    /// Connections open on the NBD server.
    pub connections: Box<dyn Fn() -> usize + Send + Sync>,
    /// Connections past their handshake using this array's export (what a `stop-array`
    /// without force waits on).
    pub array_connections: Box<dyn Fn() -> usize + Send + Sync>,
    /// The exports the server offers now (an array stopped alone has left the list).
    pub exports: Box<dyn Fn() -> Vec<String> + Send + Sync>,
    /// Stop the whole server as SIGTERM does (`flashraid stop --all`): drain, flush, mark
    /// clean. Called again while the server stops, it does nothing.
    pub request_stop: Box<dyn Fn() + Send + Sync>,
    /// Stop this socket's array alone while the server's other arrays serve on
    /// (`stop-array`, `flashraid stop`): its export withdrawn, its connections drained, the
    /// array flushed and marked clean, this control socket removed. Returns once done.
    pub stop_array: Box<dyn Fn(Withdrawal) -> ArrayStop + Send + Sync>,
    /// Start another array in this server and serve it beside the others (`start-array`,
    /// `flashraid start`): its members assembled with the server's settings, its export
    /// offered on the server's listeners, its own control socket made. Returns its name and
    /// the arrays served now, once it serves.
    pub start_array: Box<dyn Fn(StartArray) -> Result<ArrayStarted, String> + Send + Sync>,
}

/// What `start-array` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartArray {
    /// Members of one array (absolute paths).
    pub members: Vec<PathBuf>,
    /// Only the array of this name among them (as `serve --name`).
    pub name: Option<String>,
    /// Start it dirty and degraded, or with stale copies (as `serve --force`).
    pub force: bool,
}

impl StartArray {
    /// The command line: `start-array {"members":[...],"name":...,"force":...}`.
    fn to_command(&self) -> String {
        let members: Vec<String> =
            self.members.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let body = json!({ "members": members, "name": self.name, "force": self.force });
        format!("start-array {body}")
    }

    fn from_json(text: &str) -> Result<StartArray, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let members: Vec<PathBuf> = v["members"]
            .as_array()
            .ok_or("no \"members\" list")?
            .iter()
            .map(|m| m.as_str().map(PathBuf::from).ok_or("a member is not a path"))
            .collect::<Result<_, _>>()?;
        if members.is_empty() || !members.iter().all(|m| m.is_absolute()) {
            return Err("start-array needs members, as absolute paths".into());
        }
        let name = match &v["name"] {
            Value::Null => None,
            Value::String(n) => Some(n.clone()),
            _ => return Err("\"name\" is not a string".into()),
        };
        Ok(StartArray { members, name, force: v["force"].as_bool().unwrap_or(false) })
    }
}

/// What a `start-array` started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayStarted {
    pub name: String,
    pub control: PathBuf,
    /// The arrays the server serves now, this one included.
    pub serving: Vec<String>,
    /// Said at the start: degraded, resyncing, members left out (the server's log has all).
    pub notes: Vec<String>,
}

/// What a `stop-array` did.
#[derive(Debug)]
pub enum ArrayStop {
    /// The server serves this array only: nothing was done; the whole server stops instead
    /// (as `stop` does, refused while clients are connected unless forced).
    OnlyArray,
    /// Refused with nothing changed: this many NBD connections to the array are open.
    InUse(usize),
    /// Stopped alone: how it stopped (or why its shutdown failed), and the arrays the server
    /// serves on.
    Stopped { result: Result<Stopped, String>, serving: Vec<String> },
    /// The whole server is stopping already (SIGTERM, `stop --all`): nothing was done; the
    /// reply is the whole-server stop's.
    ServerStopping,
    /// Not served any more (another `stop-array` stopped it).
    NotServed,
}

pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!("{}: another server is listening there", path.display());
        }
        use std::os::unix::fs::FileTypeExt;
        if !std::fs::symlink_metadata(path)?.file_type().is_socket() {
            bail!("{} exists and is not a socket: refusing to replace it", path.display());
        }
        std::fs::remove_file(path)?;
    }
    // Bound in a private directory (0700: nobody else can reach into it), made 0600, then
    // linked into place: the socket is never reachable with the umask's mode (with a umask of
    // 0, anyone could have connected in between and failed a member), and the link, unlike a
    // rename, fails rather than replace a socket another server bound meanwhile (found by
    // review of an earlier bind-then-rename).
    let name = path.file_name().context("a control socket path names a file")?;
    let private_dir =
        path.with_file_name(format!(".{}.{}.binding", name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_dir_all(&private_dir);
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private_dir)
        .with_context(|| format!("creating {}", private_dir.display()))?;
    let private = private_dir.join("socket");
    let placed = UnixListener::bind(&private).and_then(|listener| {
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600))?;
        std::fs::hard_link(&private, path)?;
        Ok(listener)
    });
    let _ = std::fs::remove_file(&private);
    let _ = std::fs::remove_dir(&private_dir);
    let listener = match placed {
        Ok(listener) => listener,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!("{}: another server took it while this one started", path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot listen on {}", path.display())),
    };
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serve control requests until `stop`; returns once every connection's thread has ended.
pub fn serve(listener: UnixListener, context: ControlContext, stop: Arc<AtomicBool>) {
    let context = Arc::new(context);
    let mut connections: Vec<JoinHandle<()>> = Vec::with_capacity(CONTROL_CONNECTIONS_MAX);
    while !stop.load(Ordering::SeqCst) {
        // A finished thread has dropped its share of the context: nothing is left to join.
        connections.retain(|thread| !thread.is_finished());
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) => {
                // WouldBlock (none waiting) or a transient error (out of descriptors).
                std::thread::sleep(Duration::from_millis(STOP_POLL_MS));
                continue;
            }
        };
        if connections.len() >= CONTROL_CONNECTIONS_MAX {
            refuse_busy(&stream);
            continue;
        }
        let (context, stop) = (context.clone(), stop.clone());
        let spawned =
            std::thread::Builder::new().name("flashraid-control".into()).spawn(move || {
                let _ = handle(stream, &context, &stop);
            });
        // Out of threads: the connection is dropped with the closure, and the client reads
        // no reply (`ask` says the reply is not JSON).
        if let Ok(thread) = spawned {
            connections.push(thread);
        }
    }
    for thread in connections {
        let _ = thread.join();
    }
}

/// Answer a connection past `CONTROL_CONNECTIONS_MAX` that the socket is busy, without ever
/// waiting for it: the accepting thread must stay free.
fn refuse_busy(mut stream: &UnixStream) {
    let reply = json!({
        "error": format!(
            "the control socket is busy: {CONTROL_CONNECTIONS_MAX} connections are open (a \
             client that sends no command is closed after {} s); try again",
            COMMAND_WAIT_MS_MAX / 1000
        )
    });
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write_all(format!("{reply}\n").as_bytes());
    }
}

/// What a connection sent before its newline, its end or `COMMAND_BYTES_MAX`.
enum CommandLine {
    Read(String),
    /// `COMMAND_BYTES_MAX` bytes and no newline.
    TooLong,
    /// Not UTF-8.
    NotText,
    /// Nothing whole within `COMMAND_WAIT_MS_MAX`.
    TimedOut,
    /// The server stops.
    Stopped,
}

/// Read one command line, looking at `stop` every `STOP_POLL_MS` so an idle client never
/// holds a stopping server.
fn read_command(mut stream: &UnixStream, stop: &AtomicBool) -> std::io::Result<CommandLine> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(STOP_POLL_MS)))?;
    let started = Instant::now();
    let mut bytes: Vec<u8> = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(CommandLine::Stopped);
        }
        // On every pass, not only when a read times out: a client dribbling a byte at a time
        // would otherwise hold its thread until COMMAND_BYTES_MAX bytes came (found by
        // review: about two minutes, sixteen of them keeping every command "busy").
        if started.elapsed() >= Duration::from_millis(COMMAND_WAIT_MS_MAX) {
            return Ok(CommandLine::TimedOut);
        }
        let room = chunk.len().min(COMMAND_BYTES_MAX - bytes.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) => break,
            Ok(n) => {
                bytes.extend_from_slice(&chunk[..n]);
                if chunk[..n].contains(&b'\n') || bytes.len() >= COMMAND_BYTES_MAX {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    match bytes.iter().position(|&b| b == b'\n') {
        Some(newline) => bytes.truncate(newline + 1),
        None if bytes.len() >= COMMAND_BYTES_MAX => return Ok(CommandLine::TooLong),
        None => {}
    }
    Ok(String::from_utf8(bytes).map_or(CommandLine::NotText, CommandLine::Read))
}

fn handle(stream: UnixStream, context: &ControlContext, stop: &AtomicBool) -> std::io::Result<()> {
    let reply = match read_command(&stream, stop)? {
        CommandLine::Read(line) => reply_to(&line, context),
        CommandLine::TimedOut => json!({
            "error": format!(
                "no command line within {} s: send one line, e.g. `status`",
                COMMAND_WAIT_MS_MAX / 1000
            )
        }),
        CommandLine::TooLong => json!({
            "error": format!(
                "a command line longer than {COMMAND_BYTES_MAX} bytes: refused, nothing done"
            )
        }),
        CommandLine::NotText => json!({
            "error": "a command line that is not UTF-8 text: refused, nothing done (paths \
                      are named in UTF-8)"
        }),
        CommandLine::Stopped => return Ok(()),
    };
    stream.set_write_timeout(Some(Duration::from_millis(REPLY_WAIT_MS_MAX)))?;
    let mut out = reply.to_string();
    out.push('\n');
    (&stream).write_all(out.as_bytes())
}

/// The reply to one command line.
fn reply_to(line: &str, context: &ControlContext) -> Value {
    let words: Vec<&str> = line.split_whitespace().collect();
    // `spare-add force|keep readd|full PATH`: the path is the rest of the line (it may hold
    // spaces); `replace ROLE force|keep PATH` likewise.
    let trimmed = line.trim_end_matches(['\r', '\n']);
    let path_arg = trimmed.splitn(4, ' ').nth(3).map(PathBuf::from);
    match words.as_slice() {
        ["replace", role, how @ ("force" | "keep"), ..] => {
            match (role.parse::<usize>(), path_arg) {
                (Ok(role), Some(path)) if path.is_absolute() => answer(
                    context.array.replace(role, &path, overwrite(how)),
                    json!({ "ok": true }),
                ),
                _ => json!({ "error": "replace needs a member role and an absolute path" }),
            }
        }
        ["spare-add", how @ ("force" | "keep"), rebuild @ ("readd" | "full"), ..] => match path_arg
        {
            Some(path) if path.is_absolute() => {
                let re_add = if *rebuild == "full" { ReAdd::Never } else { ReAdd::IfPossible };
                answer(
                    context.array.add_spare_with(&path, overwrite(how), re_add),
                    json!({ "ok": true }),
                )
            }
            _ => json!({ "error": "spare-add needs an absolute path" }),
        },
        ["spare-remove", ..] => match trimmed.strip_prefix("spare-remove").map(str::trim_start) {
            Some(name) if name.starts_with('/') => {
                answer(context.array.remove_spare(name), json!({ "ok": true }))
            }
            _ => json!({ "error": "spare-remove needs an absolute path" }),
        },
        // `replace-named force|keep ["OLD","NEW"]`: two paths, so a JSON array of both.
        ["replace-named", how @ ("force" | "keep"), ..] => {
            let rest = trimmed.splitn(3, ' ').nth(2).unwrap_or("");
            match serde_json::from_str::<[PathBuf; 2]>(rest) {
                Ok([old, new]) if old.is_absolute() && new.is_absolute() => answer(
                    context.array.replace_named(&old.to_string_lossy(), &new, overwrite(how)),
                    json!({ "ok": true }),
                ),
                _ => json!({ "error": "replace-named needs [\"OLD\",\"NEW\"], absolute paths" }),
            }
        }
        ["replace-cancel"] => answer(context.array.cancel_replace(), json!({ "ok": true })),
        ["stop", force @ ..] if matches!(force, [] | ["force"]) => stop_server(
            context,
            if force.is_empty() { Withdrawal::IfUnused } else { Withdrawal::Force },
        ),
        ["start-array", ..] => {
            let rest = trimmed.split_once(' ').map_or("", |(_, rest)| rest);
            match StartArray::from_json(rest).and_then(|request| (context.start_array)(request)) {
                Ok(started) => json!({
                    "ok": true,
                    "array_started": started.name,
                    "control": started.control,
                    "serving": started.serving,
                    "notes": started.notes,
                    "pid": std::process::id(),
                }),
                Err(e) => json!({ "error": e }),
            }
        }
        ["stop-array", force @ ..] if matches!(force, [] | ["force"]) => stop_array(
            context,
            if force.is_empty() { Withdrawal::IfUnused } else { Withdrawal::Force },
        ),
        ["status"] => match context.array.status() {
            Ok(status) => status_json(
                &status,
                ((context.array_connections)(), (context.connections)()),
                &(context.exports)(),
            ),
            Err(e) => json!({ "error": e.to_string() }),
        },
        ["fail", role, force @ ..] if matches!(force, [] | ["force"]) => {
            let guard = if force.is_empty() { FailGuard::Refuse } else { FailGuard::Force };
            match role.parse::<usize>() {
                Ok(role) => answer(
                    context.array.fail_member_with(role, guard),
                    json!({ "ok": true, "failed_role": role }),
                ),
                Err(_) => json!({ "error": format!("not a member role: {role:?}") }),
            }
        }
        ["scrub", what @ ("check" | "repair" | "stop")] => {
            let result = match *what {
                "stop" => context.array.stop_scrub(),
                w => context.array.start_scrub(w == "repair"),
            };
            answer(result, json!({ "ok": true }))
        }
        ["rebuild-trust-parity", on @ ("on" | "off")] => answer(
            context.array.set_rebuild_trust_parity(*on == "on"),
            json!({ "ok": true, "trust_parity": *on == "on" }),
        ),
        [which @ ("rebuild-rate" | "rebuild-busy-rate"), rate] => match rate.parse::<u64>() {
            Ok(rate) if *which == "rebuild-rate" => answer(
                context.array.set_rebuild_rate(rate),
                json!({ "ok": true, "rebuild_rate_bytes_per_s": stored_rate_bytes_per_s(rate) }),
            ),
            Ok(rate) => answer(
                context.array.set_rebuild_busy_rate(rate),
                json!({ "ok": true, "rebuild_busy_rate_bytes_per_s": stored_rate_bytes_per_s(rate) }),
            ),
            Err(_) => json!({ "error": format!("not a rate in bytes per second: {rate:?}") }),
        },
        ["tune", key, value] => match (tune_key(key), value.parse::<u64>()) {
            (Some(make), Ok(v)) => match make(v) {
                Some(tunable) => answer(context.array.tune(tunable), json!({ "ok": true })),
                None => json!({ "error": format!("{key} {v} is out of range") }),
            },
            (None, _) => json!({
                "error": format!("unknown tunable {key:?}: try {}", tune_key_names())
            }),
            (_, Err(_)) => json!({ "error": format!("not a number: {value:?}") }),
        },
        _ => json!({
            "error": format!(
                "unknown command {:?}: try status, fail ROLE [force], stop [force], \
                 stop-array [force], start-array {{\"members\":[...]}}, \
                 rebuild-rate BYTES_PER_S, \
                 rebuild-busy-rate BYTES_PER_S, rebuild-trust-parity on|off, tune KEY VALUE, scrub check|repair|stop, \
                 spare-add force|keep readd|full PATH, spare-remove PATH, \
                 replace ROLE force|keep PATH, replace-named force|keep [\"OLD\",\"NEW\"] \
                 or replace-cancel",
                line.trim()
            )
        }),
    }
}

/// `stop`: the whole server stops as on SIGTERM (every array it serves), refused while the
/// NBD server counts a connection unless forced.
fn stop_server(context: &ControlContext, how: Withdrawal) -> Value {
    let connections = (context.connections)();
    if connections > 0 && how == Withdrawal::IfUnused {
        return json!({ "error": format!(
            "{connections} NBD connection(s) are open: a client still uses the \
             array (a mounted filesystem, nbd-client, qemu). Disconnect them first, or \
             pass --force to close them (their requests in flight finish first)"
        ) });
    }
    let read_only = context.array.status().is_ok_and(|s| s.read_only);
    let arrays = (context.exports)();
    (context.request_stop)();
    json!({
        "ok": true,
        "arrays": arrays,
        "connections": connections,
        "read_only": read_only,
        // The CLI waits for this process to exit: its control socket goes
        // before the arrays are flushed.
        "pid": std::process::id(),
    })
}

/// `stop-array`: this socket's array stops alone, the server's others serve on; the only
/// array of a server stops the server (as `stop`). The reply comes once it has stopped.
fn stop_array(context: &ControlContext, how: Withdrawal) -> Value {
    let name = &context.name;
    match (context.stop_array)(how) {
        ArrayStop::OnlyArray => stop_server(context, how),
        // Its connections are being closed anyway: nothing to refuse.
        ArrayStop::ServerStopping => stop_server(context, Withdrawal::Force),
        ArrayStop::InUse(connections) => json!({ "error": format!(
            "{connections} NBD connection(s) to array {name:?} are open: a client still uses \
             it (a mounted filesystem, nbd-client, qemu). Disconnect them first, or pass \
             --force to close them (their requests in flight finish first); nothing was \
             stopped"
        ) }),
        ArrayStop::NotServed => {
            json!({ "error": format!("array {name:?} is stopped already (or stopping)") })
        }
        ArrayStop::Stopped { result: Ok(stopped), serving } => json!({
            "ok": true,
            "array_stopped": name,
            "stopped": match stopped {
                Stopped::Clean => "clean",
                Stopped::Dirty => "dirty",
                Stopped::Untouched => "untouched",
            },
            "serving": serving,
            "pid": std::process::id(),
        }),
        ArrayStop::Stopped { result: Err(e), serving } => json!({ "error": format!(
            "array {name:?} was taken out of the server (export and control socket gone; \
             arrays serving on: {}) but its stop failed: {e}. Its next start resyncs what \
             it left dirty",
            if serving.is_empty() { "none".to_string() } else { serving.join(", ") }
        ) }),
    }
}

/// The reply to a command: `ok` if it worked, else its error.
fn answer(result: Result<(), flashraid_runtime::ArrayError>, ok: Value) -> Value {
    match result {
        Ok(()) => ok,
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn overwrite(how: &str) -> Overwrite {
    if how == "force" { Overwrite::Force } else { Overwrite::Refuse }
}

/// `connections`: (to this array, to the whole server).
fn status_json(s: &ArrayStatus, connections: (usize, usize), exports: &[String]) -> Value {
    let c = &s.counters;
    let state = if s.failed {
        "failed"
    } else if s.rebuild.is_some() {
        "rebuilding"
    } else if s.degraded {
        "degraded"
    } else if s.resyncing {
        "resyncing"
    } else {
        "optimal"
    };
    let mut status = json!({
        "name": s.name,
        "uuid": s.uuid.to_string(),
        "level": s.level.name(),
        "state": state,
        "size_bytes": s.array_bytes,
        "chunk_bytes": s.chunk_bytes,
        "degraded": s.degraded,
        "failed": s.failed,
        "resyncing": s.resyncing,
        "bitmap_regions_dirty": s.bitmap_regions_set,
        "member_reads_retried": s.member_reads_retried,
        "member_ios_merged": s.member_ios_merged,
        "shards": s.shards,
        "queue_depth": s.queue_depth,
        "event": s.event,
        "spares": s.spares,
        "held_unlisted": s.held_unlisted,
        "scrub": s.scrub.as_ref().map(|x| json!({
            "mode": if x.repair { "repair" } else { "check" },
            "running": x.running,
            "percent": if x.tally.stripes_total == 0 { 100.0 } else {
                (x.tally.stripes_checked as f64 * 1000.0 / x.tally.stripes_total as f64).round() / 10.0
            },
            "stripes_checked": x.tally.stripes_checked,
            "stripes_total": x.tally.stripes_total,
            "mismatches": x.tally.mismatches,
            "located": x.tally.located,
            "repaired": x.tally.repaired,
            "read_errors_repaired": x.tally.read_errors_repaired,
            "read_errors_left": x.tally.read_errors_left,
            "unreadable": x.tally.unreadable,
            "untrusted": x.tally.untrusted,
            "stopped": x.stopped,
            "seconds": (x.seconds * 10.0).round() / 10.0,
        })),
        "rebuild": s.rebuild.as_ref().map(|r| json!({
            "role": r.role,
            "path": r.path,
            "percent": (r.percent() * 10.0).round() / 10.0,
            "stripes_done": r.stripes_done,
            "stripes_total": r.stripes_total,
            "rate_bytes_per_s": r.rate_bytes_per_s,
            "eta_s": r.eta_s,
            "rate_limit_bytes_per_s": r.rate_limit_bytes_per_s,
            "stalled_at_stripe": r.stalled_at_stripe,
            // Why, in the operator's words: past the tolerance nothing is left to rebuild
            // from, and only a forced start brings the array (and the rebuild) back.
            "stalled_reason": r.stalled_at_stripe.map(|_| match r.stall_cause {
                _ if s.failed => "the array is failed past its tolerance: stop it and start \
                    it with --force (the rebuild resumes from its recorded cursor)",
                // Found by review: every stall was said to be "too many members unreadable".
                Some(flashraid_engine::StallCause::Unverifiable) => {
                    flashraid_runtime::UNVERIFIABLE_STALL
                }
                // (The retry interval is in the `rebuild-stalled` event: it is a setting.)
                _ => "more members unreadable there than the level survives; it tries again \
                    on its own (a member that reads again, or the stripe written anew, lets \
                    it go on)",
            }),
            "stall_cause": r.stall_cause.map(|c| match c {
                flashraid_engine::StallCause::Unreadable => "unreadable",
                flashraid_engine::StallCause::Unverifiable => "unverifiable",
            }),
            "trust_parity": r.trust_parity,
            "partial": r.partial,
            "copying": r.copying,
        })),
        "members": s.members.iter().map(|m| json!({
            "role": m.role,
            "path": m.path,
            "health": format!("{:?}", m.health).to_lowercase(),
        })).collect::<Vec<_>>(),
        "counters": {
            "reads": c.reads, "writes": c.writes, "read_bytes": c.read_bytes,
            "write_bytes": c.write_bytes, "flushes": c.flushes,
            "full_stripe_writes": c.full_stripe_writes, "rmw_writes": c.rmw_writes,
            "rcw_writes": c.rcw_writes, "degraded_reads": c.degraded_reads,
            "degraded_writes": c.degraded_writes, "errors_corrected": c.errors_corrected,
            "member_reads": c.member_reads, "member_writes": c.member_writes,
            "bitmap_writes": c.bitmap_writes, "resync_stripes": c.resync_stripes,
            "resync_repairs": c.resync_repairs, "rebuild_stripes": c.rebuild_stripes,
            "rebuild_untrusted_stripes": c.rebuild_untrusted_stripes,
            "rebuild_unverified_stripes": c.rebuild_unverified_stripes,
            "merge_waits": c.merge_waits, "merge_filled": c.merge_filled,
        },
        "nbd": {
            "exports": exports,
            "connections": connections.0,
            "server_connections": connections.1,
        },
        "tunables": crate::array_cmds::tunables_json(&s.tunables),
        "events": s.events.iter().map(|e| json!({
            "unix_seconds": e.unix_seconds,
            "kind": e.kind,
            "message": e.message,
        })).collect::<Vec<_>>(),
    });
    // Beside the stored tunables: the timeout in force (the default when none is stored).
    status["member_timeout_ms"] = json!(s.member_timeout_ms);
    status["read_only"] = json!(s.read_only);
    status
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The server's control socket (default: the only one in /run/flashraid, or
    /// /run/flashraid/NAME.control with --name).
    #[arg(long)]
    control: Option<PathBuf>,
    /// The array's name, to find its control socket.
    #[arg(long)]
    name: Option<String>,
    /// Print JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct FailArgs {
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// The member's role (its position in the array, as `status` lists it). A role names a
    /// position, not a device: once a hot spare has taken a failed role over, the role is
    /// being rebuilt onto that spare, so `fail` of it again is refused (it would fail the
    /// spare) unless --force.
    role: usize,
    /// Fail it even if the array cannot survive without it (members already failed or
    /// missing, and one being rebuilt, count as out): the array then fails, writes are
    /// refused and reads of lost data return errors. Also fails the device a role is being
    /// rebuilt onto (a spare that took it over). Without it both are refused and nothing
    /// changes.
    #[arg(long)]
    force: bool,
}

fn find_control(control: Option<PathBuf>, name: Option<&str>) -> Result<PathBuf> {
    if let Some(path) = control {
        return Ok(path);
    }
    if let Some(name) = name {
        return default_control_path(name);
    }
    let dir = control_dir();
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|dir| {
            dir.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "control"))
                .collect()
        })
        .unwrap_or_default();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!(
            "no flashraid server is running here (no socket in {}); give --control, or set \
             {CONTROL_DIR_ENV} to the directory `serve --control-dir` was given",
            dir.display()
        ),
        _ => bail!("{SEVERAL_ARRAYS}; say which with --name or --control"),
    }
}

/// How `find_control` begins its refusal when the control directory holds several sockets.
const SEVERAL_ARRAYS: &str = "several arrays are served here";

pub(crate) fn ask(path: &Path, command: &str) -> Result<Value> {
    ask_waiting(path, command, Duration::from_secs(30))
}

/// `ask`, waiting up to `reply_wait` for the reply.
fn ask_waiting(path: &Path, command: &str, reply_wait: Duration) -> Result<Value> {
    if command.len() + 1 > COMMAND_BYTES_MAX {
        bail!("a command of {} bytes: longer than the control socket takes", command.len());
    }
    let mut stream = UnixStream::connect(path)
        .with_context(|| format!("cannot reach the server at {}", path.display()))?;
    stream.set_read_timeout(Some(reply_wait))?;
    // A busy server answers and closes without reading the command, so the write may fail
    // while its reply waits to be read: read it before giving the write's error.
    let written = stream.write_all(format!("{command}\n").as_bytes());
    let mut line = String::new();
    let read = BufReader::new(stream).read_line(&mut line);
    if line.is_empty() {
        written.with_context(|| format!("cannot send {command:?} to {}", path.display()))?;
        read.with_context(|| format!("no reply from the server at {}", path.display()))?;
    }
    let value: Value = serde_json::from_str(&line).context("the server's reply is not JSON")?;
    if let Some(error) = value.get("error").and_then(Value::as_str) {
        bail!("{error}");
    }
    Ok(value)
}

/// Whether `ask_waiting` gave up waiting for the reply (as opposed to a refused or broken
/// connection).
fn is_reply_timeout(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        })
    })
}

pub fn run_status(args: StatusArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    let v = ask(&path, "status")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let size = v["size_bytes"].as_u64().unwrap_or(0);
    println!(
        "{} ({}): {}, {}, chunk {} KiB, {} shards, event {}",
        v["name"].as_str().unwrap_or("?"),
        v["uuid"].as_str().unwrap_or("?"),
        v["level"].as_str().unwrap_or("?"),
        crate::array_cmds::human(size),
        v["chunk_bytes"].as_u64().unwrap_or(0) >> 10,
        v["shards"],
        v["event"],
    );
    let read_only = v["read_only"].as_bool().unwrap_or(false);
    let said = if read_only { ", read-only (nothing is written to the members)" } else { "" };
    println!("state: {}{said}", v["state"].as_str().unwrap_or("?"));
    if v["bitmap_regions_dirty"].as_u64().unwrap_or(0) > 0 {
        if read_only {
            // Nothing resyncs them read-only: say what that means for reads.
            println!(
                "write-intent bitmap: {} regions dirty, not resynced (read-only): their data \
                 chunks read as written, but a read there that needs reconstruction fails",
                v["bitmap_regions_dirty"]
            );
        } else {
            println!("write-intent bitmap: {} regions dirty", v["bitmap_regions_dirty"]);
        }
    }
    println!("members:");
    for m in v["members"].as_array().into_iter().flatten() {
        println!(
            "  {:>3}  {:<8} {}",
            m["role"],
            m["health"].as_str().unwrap_or("?"),
            m["path"].as_str().unwrap_or("(missing)")
        );
    }
    for spare in v["spares"].as_array().into_iter().flatten() {
        println!("  spare    {}", spare.as_str().unwrap_or("?"));
    }
    for held in v["held_unlisted"].as_array().into_iter().flatten() {
        println!(
            "  held     {} (no longer in the array; `spare remove` lets go of it)",
            held.as_str().unwrap_or("?")
        );
    }
    if let Some(line) = rebuild_line(&v["rebuild"]) {
        println!("{line}");
    }
    if let Some(line) = scrub_line(&v["scrub"]) {
        println!("{line}");
    }
    let c = &v["counters"];
    println!(
        "io: {} reads ({}), {} writes ({}); writes: {} full-stripe, {} read-modify-write, {} reconstruct; {} degraded reads, {} errors corrected",
        c["reads"],
        crate::array_cmds::human(c["read_bytes"].as_u64().unwrap_or(0)),
        c["writes"],
        crate::array_cmds::human(c["write_bytes"].as_u64().unwrap_or(0)),
        c["full_stripe_writes"],
        c["rmw_writes"],
        c["rcw_writes"],
        c["degraded_reads"],
        c["errors_corrected"],
    );
    println!(
        "nbd: exports {}, {} connections to this array ({} to the server)",
        v["nbd"]["exports"], v["nbd"]["connections"], v["nbd"]["server_connections"]
    );
    let events = v["events"].as_array().cloned().unwrap_or_default();
    if !events.is_empty() {
        println!("recent events:");
        for e in events.iter().rev().take(5).rev() {
            println!(
                "  {}  {:<18} {}",
                e["unix_seconds"],
                e["kind"].as_str().unwrap_or("?"),
                e["message"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}

/// `rebuild: member 2  [#####.....] 48.0%  310 MiB/s  ETA 2m05s`, or `None` if none runs.
fn rebuild_line(r: &Value) -> Option<String> {
    if r.is_null() {
        return None;
    }
    let percent = r["percent"].as_f64().unwrap_or(0.0);
    let filled = ((percent / 100.0) * 30.0).round().clamp(0.0, 30.0) as usize;
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(30 - filled));
    let rate = r["rate_bytes_per_s"].as_u64().unwrap_or(0);
    let eta = match r["eta_s"].as_u64() {
        Some(s) => format!("ETA {}m{:02}s", s / 60, s % 60),
        None => "ETA ?".to_string(),
    };
    let limit = match r["rate_limit_bytes_per_s"].as_u64().unwrap_or(0) {
        0 => String::new(),
        l => format!(" (limit {}/s)", crate::array_cmds::human(l)),
    };
    let stalled = match r["stalled_at_stripe"].as_u64() {
        Some(s) => format!(
            "  STALLED at stripe {s}: {}",
            r["stalled_reason"].as_str().unwrap_or("too many members unreadable")
        ),
        None => String::new(),
    };
    let partial = if r["copying"].as_bool() == Some(true) {
        " (replace: copying the old member; the array keeps its redundancy)"
    } else if r["partial"].as_bool() == Some(true) {
        " (partial: only the regions it missed)"
    } else {
        ""
    };
    Some(format!(
        "rebuild{partial}: member {} onto {}  [{bar}] {percent:.1}%  {}/s{limit}  {eta}{stalled}",
        r["role"],
        r["path"].as_str().unwrap_or("?"),
        crate::array_cmds::human(rate),
    ))
}

/// `scrub (check): running [####......] 40.0%  0 mismatches ...`, or `None` if none ran.
fn scrub_line(x: &Value) -> Option<String> {
    if x.is_null() {
        return None;
    }
    let percent = x["percent"].as_f64().unwrap_or(0.0);
    let filled = ((percent / 100.0) * 30.0).round().clamp(0.0, 30.0) as usize;
    let bar = format!("{}{}", "#".repeat(filled), ".".repeat(30 - filled));
    let state = match (x["running"].as_bool(), x["stopped"].as_str()) {
        (Some(true), _) => "running".to_string(),
        (_, Some(why)) => format!("stopped: {why}"),
        _ => "finished".to_string(),
    };
    let untrusted = match x["untrusted"].as_u64() {
        Some(n) if n > 0 => format!(", {n} passed over (awaiting resync)"),
        _ => String::new(),
    };
    // Read-only (or in a mismatched stripe): read errors are reported, not rewritten.
    let left = match x["read_errors_left"].as_u64() {
        Some(n) if n > 0 => format!(", {n} read errors left as they are"),
        _ => String::new(),
    };
    Some(format!(
        "scrub ({}): {state}  [{bar}] {percent:.1}%  {} mismatched stripes ({} located), {} repaired, {} read errors rewritten{left}, {} unreadable{untrusted}, {} s",
        x["mode"].as_str().unwrap_or("?"),
        x["mismatches"],
        x["located"],
        x["repaired"],
        x["read_errors_repaired"],
        x["unreadable"],
        x["seconds"],
    ))
}

#[derive(Args, Debug)]
pub struct ScrubArgs {
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Rewrite what disagrees (default: check and report only; read errors are rewritten
    /// from redundancy either way, except on an array served read-only, where a check
    /// writes nothing and reports them instead). Refused on a read-only array.
    #[arg(long, conflicts_with = "stop")]
    repair: bool,
    /// Stop the running scrub.
    #[arg(long)]
    stop: bool,
    /// Show a progress bar until the scrub finishes, then its results.
    #[arg(long)]
    wait: bool,
}

/// `flashraid scrub`: check (or repair) every stripe of a served array.
pub fn run_scrub(args: ScrubArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    let command = match (args.stop, args.repair) {
        (true, _) => "scrub stop",
        (false, true) => "scrub repair",
        (false, false) => "scrub check",
    };
    if args.stop {
        // Found by review: "scrub stopped" was printed with no scrub running.
        let running = ask(&path, "status")?["scrub"]["running"].as_bool().unwrap_or(false);
        if !running {
            println!("no scrub is running");
            return Ok(());
        }
        ask(&path, command)?;
        println!("scrub stopped");
        return Ok(());
    }
    if let Err(e) = ask(&path, command) {
        if args.repair && e.to_string().contains("served read-only") {
            bail!("{e:#}; a check (scrub without --repair) writes nothing and runs read-only");
        }
        return Err(e);
    }
    loop {
        let v = ask(&path, "status")?;
        let line = scrub_line(&v["scrub"]).unwrap_or_else(|| "scrub: not started".into());
        let running = v["scrub"]["running"].as_bool().unwrap_or(false);
        if !args.wait {
            println!("{line}");
            return Ok(());
        }
        if !running {
            println!("\r{line}\x1b[K");
            return Ok(());
        }
        print!("\r{line}\x1b[K");
        std::io::stdout().flush()?;
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[derive(Args, Debug)]
pub struct SpareArgs {
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Overwrite a device that holds a filesystem, a partition table or another array.
    #[arg(long)]
    force: bool,
    /// A member of this array that failed and came back is normally re-added to its role
    /// with only the regions written while it was away rebuilt; this makes it a plain spare
    /// instead (a takeover then rebuilds it in full).
    #[arg(long)]
    full_rebuild: bool,
    /// `add` a hot spare, or `remove` one (it leaves the array's superblocks and its own are
    /// erased, so it no longer claims the array, and the server closes it; the target of a
    /// running replace is refused: `replace --cancel` first). `remove` of a failed member
    /// the array no longer uses closes it, keeping its superblocks (`add` takes it back).
    #[arg(value_parser = ["add", "remove"])]
    action: String,
    /// The device or file to add or remove (for `remove`, as `status` lists the spares and
    /// the devices it holds that are no longer in the array).
    device: PathBuf,
}

/// `flashraid spare add DEVICE`: a hot spare for a served array, while it runs.
/// `flashraid spare remove DEVICE`: take one out.
pub fn run_spare(args: SpareArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    if args.action == "remove" {
        if args.force || args.full_rebuild {
            bail!("--force and --full-rebuild are for `spare add`");
        }
        // Not resolved here: the server matches the path as given or resolved against the
        // names it opened (a spare being removed may have vanished, or been named through a
        // symlink when it was added).
        let device = std::path::absolute(&args.device)
            .with_context(|| format!("{}: not a path", args.device.display()))?;
        ask(&path, &format!("spare-remove {}", utf8_path(&device)?))?;
        let v = ask(&path, "status")?;
        let removed = v["events"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
            .find(|e| e["kind"] == "spare-removed" || e["kind"] == "member-released")
            .and_then(|e| e["message"].as_str());
        // A spare: erased and closed. A failed member: closed (its superblocks kept).
        let done = |m: &str| {
            (m.contains("are erased") || m.contains("is let go")) && m.contains("has closed it")
        };
        match removed {
            Some(message) if done(message) => println!("{message}"),
            Some(message) => eprintln!("flashraid: warning: {message}"),
            None => println!("{} removed", device.display()),
        }
        return Ok(());
    }
    let device = std::fs::canonicalize(&args.device)
        .with_context(|| format!("{}: cannot find it", args.device.display()))?;
    let how = if args.force { "force" } else { "keep" };
    let rebuild = if args.full_rebuild { "full" } else { "readd" };
    ask(&path, &format!("spare-add {how} {rebuild} {}", utf8_path(&device)?))?;
    let v = ask(&path, "status")?;
    println!("{}", spare_add_report(&device.display().to_string(), &v));
    Ok(())
}

/// A path as the control socket names it: UTF-8 text, or refused (found by review: a lossy
/// conversion named another file, which the server then took as a spare).
fn utf8_path(path: &Path) -> Result<&str> {
    path.to_str().with_context(|| {
        format!(
            "{}: a path that is not UTF-8 cannot be named to the server (it names devices \
             in UTF-8): rename it",
            path.display()
        )
    })
}

/// What `spare add` did with `device`, from the status that followed: where the device is
/// now (a role, or the spares) says it, and the newest event naming it whether it took its
/// own role back. Found by a misuse test: a spare added during a rebuild was said to have
/// taken over a failed member, and a member taking its role back in full was said to be a
/// hot spare.
fn spare_add_report(device: &str, v: &Value) -> String {
    let resolved = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    let this = resolved(device);
    let names_it = |p: &Value| p.as_str().is_some_and(|p| p == device || resolved(p) == this);
    let role = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| names_it(&m["path"]))
        .and_then(|m| m["role"].as_u64());
    let re_added = v["events"].as_array().is_some_and(|events| {
        events
            .iter()
            .rev()
            .find(|e| {
                matches!(e["kind"].as_str(), Some("member-re-added" | "spare-added"))
                    && e["message"].as_str().is_some_and(|m| m.contains(device))
            })
            .is_some_and(|e| e["kind"] == "member-re-added")
    });
    let rebuild = rebuild_line(&v["rebuild"]);
    let rebuilding = role.is_some() && v["rebuild"]["role"].as_u64() == role;
    match (role, rebuild) {
        (Some(r), Some(line)) if rebuilding && re_added => format!(
            "{device} re-added to its role {r}: only the regions written while it was away \
             are rebuilt\n{line}"
        ),
        (Some(r), Some(line)) if rebuilding => {
            format!("{device} added; it took over failed member {r}\n{line}")
        }
        (Some(r), _) if re_added => format!("{device} re-added to its role {r}, rebuilt already"),
        (Some(r), _) => {
            format!("{device} added; it took over failed member {r}, rebuilt already")
        }
        (None, rebuild) if v["spares"].as_array().into_iter().flatten().any(names_it) => {
            let failed: Vec<u64> = v["members"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|m| m["path"].is_null())
                .filter_map(|m| m["role"].as_u64())
                .collect();
            match (failed.first(), rebuild) {
                (Some(f), Some(line)) => format!(
                    "{device} added as a hot spare; it takes over failed member {f} once the \
                     running rebuild ends\n{line}"
                ),
                (_, Some(line)) => format!("{device} added as a hot spare\n{line}"),
                (_, None) => format!("{device} added as a hot spare"),
            }
        }
        (None, _) => format!(
            "{device} was added but is neither a member nor a spare now (a write to it \
             failed?): see `flashraid status`"
        ),
    }
}

#[derive(Args, Debug)]
pub struct ReplaceArgs {
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Overwrite a NEW device that holds a filesystem, a partition table or another array.
    #[arg(long)]
    force: bool,
    /// Give up the running replace while it copies (also one resumed at a start): the old
    /// member stays in service, NEW stays a hot spare (`spare remove` takes it out).
    #[arg(long, conflicts_with_all = ["old", "new", "force"])]
    cancel: bool,
    /// The member to replace: its path from this directory or absolute (the server matches
    /// it to the name it holds the member under, or to the same file by another name).
    #[arg(required_unless_present = "cancel")]
    old: Option<PathBuf>,
    /// The device or file that takes its place.
    #[arg(required_unless_present = "cancel")]
    new: Option<PathBuf>,
}

/// `path` made absolute against the working directory: resolved (links, `..`) when it
/// exists, else as written (a member that vanished is still named by its path).
fn absolute_path(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .with_context(|| format!("{}: not a path", path.display()))
}

/// `flashraid replace OLD NEW`: NEW is added as a spare (or used, if it is one already),
/// OLD's data area is copied to it while the array keeps its redundancy, then OLD is failed
/// and NEW (not another spare) takes its role; only what was written during the copy is
/// rebuilt. In-memory members are not copied (NEW is rebuilt from the others).
pub fn run_replace(args: ReplaceArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    let (Some(old), Some(new)) = (&args.old, &args.new) else {
        assert!(args.cancel, "clap requires OLD and NEW without --cancel");
        ask(&path, "replace-cancel")?;
        println!(
            "replace cancelled: the old member stays in service, the new device is a hot spare"
        );
        return Ok(());
    };
    // The server finds OLD among the members (`status` lists them by the names it opened
    // them with, relative to its own directory perhaps): this side only makes it absolute
    // against ours, resolved when it exists (found by a misuse test: the CLI resolved the
    // server's relative names against its own directory, and found no member).
    let old = absolute_path(old)?;
    let new =
        std::fs::canonicalize(new).with_context(|| format!("{}: cannot find it", new.display()))?;
    let how = if args.force { "force" } else { "keep" };
    let both = serde_json::to_string(&[&old, &new])?;
    ask(&path, &format!("replace-named {how} {both}"))?;
    let v = ask(&path, "status")?;
    // The role being rebuilt, or (a small copy may already have finished) the one NEW holds.
    let holds_new = |m: &&serde_json::Value| {
        m["path"].as_str().is_some_and(|p| absolute_path(Path::new(p)).is_ok_and(|p| p == new))
    };
    let role = v["rebuild"]["role"]
        .as_u64()
        .or_else(|| v["members"].as_array()?.iter().find(holds_new)?["role"].as_u64())
        .map_or_else(|| "?".into(), |r| r.to_string());
    println!("member {role} ({}) is being replaced by {}", old.display(), new.display());
    if let Some(line) = rebuild_line(&v["rebuild"]) {
        println!("{line}");
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct RebuildArgs {
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Set the rebuild rate limit, bytes per second for the whole array (e.g. 500M; 0: no
    /// limit). Lower keeps foreground latency down; higher finishes sooner. Stored, and
    /// kept to, in whole MiB/s, rounded up.
    #[arg(long, value_parser = crate::array_cmds::parse_size)]
    rate: Option<u64>,
    /// Set the limit that applies while clients use the array (0: none but --rate). Stored,
    /// and kept to, in whole MiB/s, rounded up.
    #[arg(long, value_parser = crate::array_cmds::parse_size)]
    busy_rate: Option<u64>,
    /// Show a progress bar until the rebuild (and any that follows it) finishes; exits with
    /// an error, saying why, if it stalls.
    #[arg(long)]
    wait: bool,
    /// Let the rebuild write its reconstruction of stripes it cannot verify (in regions an
    /// unclean shutdown left dirty while the array was degraded) instead of stalling there,
    /// as md does after a forced start: a stripe that was being written at that shutdown
    /// gets a wrong chunk on the replacement (the write hole); every other stripe gets its
    /// redundancy back. Until the server stops. `--trust-parity=false` turns it off.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    trust_parity: Option<bool>,
}

/// The `tune` command's keys, each with how it makes its [`Tunable`] from a number (`None`:
/// out of range for the tunable's type). The parser and the error that lists the valid keys
/// both read this one table, so the list cannot leave a key out (found by review: it had
/// left out `member-timeout-ms`).
const TUNE_KEYS: [(&str, MakeTunable); 7] = [
    ("resync-rate", |v| Some(Tunable::ResyncRate(v))),
    ("scrub-rate", |v| Some(Tunable::ScrubRate(v))),
    ("scrub-every-hours", |v| u32::try_from(v).ok().map(Tunable::ScrubEveryHours)),
    ("merge-window-us", |v| u32::try_from(v).ok().map(Tunable::MergeWindowUs)),
    ("shards", |v| u32::try_from(v).ok().map(Tunable::Shards)),
    ("queue-depth", |v| u32::try_from(v).ok().map(Tunable::QueueDepth)),
    ("member-timeout-ms", |v| u32::try_from(v).ok().map(Tunable::MemberTimeoutMs)),
];

/// How a `tune` key makes its [`Tunable`] from the number given.
type MakeTunable = fn(u64) -> Option<Tunable>;

fn tune_key(key: &str) -> Option<MakeTunable> {
    TUNE_KEYS.iter().find(|(name, _)| *name == key).map(|(_, make)| *make)
}

/// `a, b or c`: the keys `tune` takes.
fn tune_key_names() -> String {
    let names: Vec<&str> = TUNE_KEYS.iter().map(|(name, _)| *name).collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[derive(Args, Debug)]
pub struct TuneArgs {
    #[arg(long)]
    control: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    tunables: crate::array_cmds::TunableArgs,
}

/// `flashraid tune`: change a served array's tunables live (each is stored with the array;
/// shards and queue depth apply at the next start), or show them.
pub fn run_tune(args: TuneArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    let t = &args.tunables;
    // Said as stored: whole MiB/s, rounded up (the server keeps to the same).
    let rate = |bytes: u64| crate::array_cmds::stored_rate_text(bytes, "no limit");
    let tune = |key: &str, v: u64| format!("tune {key} {v}");
    // (what, control command, value as shown)
    let mut changes: Vec<(&str, String, String)> = vec![];
    if let Some(r) = t.rebuild_rate {
        changes.push(("rebuild rate", format!("rebuild-rate {r}"), rate(r)));
    }
    if let Some(r) = t.rebuild_busy_rate {
        let shown = crate::array_cmds::stored_rate_text(r, "no separate limit");
        changes.push(("rebuild rate while busy", format!("rebuild-busy-rate {r}"), shown));
    }
    if let Some(r) = t.resync_rate {
        changes.push(("resync rate", tune("resync-rate", r), rate(r)));
    }
    if let Some(r) = t.scrub_rate {
        changes.push(("scrub rate", tune("scrub-rate", r), rate(r)));
    }
    if let Some(h) = t.scrub_every_hours {
        changes.push(("scrub every (hours)", tune("scrub-every-hours", h.into()), h.to_string()));
    }
    if let Some(us) = t.merge_window_us {
        changes.push(("merge window (us)", tune("merge-window-us", us.into()), us.to_string()));
    }
    if let Some(n) = t.shards {
        changes.push(("shards (from the next start)", tune("shards", n.into()), n.to_string()));
    }
    if let Some(n) = t.queue_depth {
        let what = "queue depth (from the next start)";
        changes.push((what, tune("queue-depth", n.into()), n.to_string()));
    }
    if let Some(ms) = t.member_timeout_ms {
        let shown = if ms == 0 { "never".to_string() } else { ms.to_string() };
        changes.push(("member timeout (ms)", tune("member-timeout-ms", ms.into()), shown));
    }
    for (what, command, shown) in &changes {
        ask(&path, command)?;
        println!("{what}: {shown} (stored)");
    }
    if changes.is_empty() {
        let status = ask(&path, "status")?;
        println!("{}", serde_json::to_string_pretty(&status["tunables"])?);
    }
    Ok(())
}

/// `flashraid rebuild`: show or steer the rebuild of a served array.
pub fn run_rebuild(args: RebuildArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    if let Some(rate) = args.rate {
        ask(&path, &format!("rebuild-rate {rate}"))?;
        let shown = crate::array_cmds::stored_rate_text(rate, "no limit");
        println!("rebuild rate: {shown} (stored)");
    }
    if let Some(rate) = args.busy_rate {
        ask(&path, &format!("rebuild-busy-rate {rate}"))?;
        let shown = crate::array_cmds::stored_rate_text(rate, "no separate limit");
        println!("rebuild rate while busy: {shown} (stored)");
    }
    if let Some(on) = args.trust_parity {
        ask(&path, &format!("rebuild-trust-parity {}", if on { "on" } else { "off" }))?;
        println!(
            "{}",
            if on {
                "the rebuild writes reconstructions it cannot verify (until the server \
                 stops); status counts them as rebuild_unverified_stripes"
            } else {
                "the rebuild stalls at stripes it cannot verify"
            }
        );
    }
    let mut shown = false;
    loop {
        let v = ask(&path, "status")?;
        if args.wait && !v["rebuild"]["stalled_at_stripe"].is_null() {
            // Found by review: `--wait` waited for good on a rebuild that cannot go on.
            if let Some(line) = rebuild_line(&v["rebuild"]) {
                println!("\r{line}\x1b[K");
            }
            bail!(
                "the rebuild is stalled (it retries in the background; `flashraid status` \
                 shows when it goes on)"
            );
        }
        match rebuild_line(&v["rebuild"]) {
            Some(line) => {
                if args.wait {
                    print!("\r{line}\x1b[K");
                    std::io::stdout().flush()?;
                } else {
                    println!("{line}");
                }
                shown = true;
            }
            None => {
                if shown && args.wait {
                    println!();
                }
                if !shown || args.wait {
                    println!("no rebuild running; state: {}", v["state"].as_str().unwrap_or("?"));
                }
                return Ok(());
            }
        }
        if !args.wait {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[derive(Args, Debug)]
pub struct StartArgs {
    /// An array the server serves, by name: the new array starts in that server (its
    /// control socket is CONTROL_DIR/NAME.control).
    #[arg(long)]
    server: Option<String>,
    /// The control socket of an array the server serves (instead of --server).
    #[arg(long, conflicts_with = "server")]
    control: Option<PathBuf>,
    /// Only the array with this name among the members given.
    #[arg(long)]
    name: Option<String>,
    /// Start it even dirty and degraded, or with stale copies of members (as `serve
    /// --force`; see the refusal message for what that risks).
    #[arg(long)]
    force: bool,
    /// Members of the array to start.
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

/// `flashraid start`: start another array in a running server, beside the arrays it
/// serves (an array stopped alone with `flashraid stop` comes back this way, on the same
/// NBD listeners): assembled with the server's settings, exported under its name, with its
/// own control socket in the server's control directory.
pub fn run_start(args: StartArgs) -> Result<()> {
    let path = find_control(args.control, args.server.as_deref()).map_err(|e| {
        if e.to_string().starts_with(SEVERAL_ARRAYS) {
            anyhow::anyhow!(
                "{SEVERAL_ARRAYS}, maybe by several servers: name an array of the server to \
                 start it in with --server (or --control)"
            )
        } else {
            e
        }
    })?;
    let mut members = vec![];
    for m in &args.members {
        members
            .push(std::path::absolute(m).with_context(|| format!("member path {}", m.display()))?);
    }
    let request = StartArray { members, name: args.name, force: args.force };
    let v = match ask_waiting(&path, &request.to_command(), Duration::from_secs(START_WAIT_S)) {
        Ok(v) => v,
        Err(e) if e.to_string().contains("unknown command") => bail!(
            "{e:#}\nthis server cannot start another array (an older version): serve it with \
             `flashraid serve` in a server of its own"
        ),
        Err(e) => return Err(e),
    };
    let serving: Vec<&str> = v["serving"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    println!(
        "array {} started in the server (pid {}){}: export {}, control {}; the server serves: {}",
        v["array_started"].as_str().unwrap_or("?"),
        v["pid"],
        if notes.is_empty() { String::new() } else { format!(", {}", notes.join(", ")) },
        v["array_started"].as_str().unwrap_or("?"),
        v["control"].as_str().unwrap_or("?"),
        serving.join(", ")
    );
    Ok(())
}

/// Seconds `flashraid start` waits for the server's reply (an assembly reads every member's
/// superblocks and writes two passes of them).
const START_WAIT_S: u64 = 120;

#[derive(Args, Debug)]
pub struct StopArgs {
    /// The array's control socket (it names the array to stop).
    #[arg(long)]
    control: Option<PathBuf>,
    /// The array to stop, by name (its control socket is CONTROL_DIR/NAME.control).
    #[arg(long)]
    name: Option<String>,
    /// Stop the whole server: every array it serves, as SIGTERM does. Without it only the
    /// named array stops while the server's other arrays serve on (a server left with no
    /// array stops: stopping its only array stops it).
    #[arg(long)]
    all: bool,
    /// Stop even while NBD clients are connected (they are disconnected once their requests
    /// in flight finish). Without it an array with open connections is not stopped (with
    /// --all, a server with any).
    #[arg(long)]
    force: bool,
    /// Seconds to wait for the stop to finish: the server's exit, or the one array's drain
    /// and flush (0: do not wait; a refusal is still reported). Past it the stop goes on in
    /// the server, and the command exits 1 saying so.
    #[arg(long, default_value_t = 120)]
    wait_s: u64,
}

/// `flashraid stop`: like `mdadm --stop`, the array behind the control socket stops
/// (connections drained, flushed, marked clean, its export and control socket removed)
/// while the server's other arrays serve on; a server's only array stops the server, as on
/// SIGTERM, and so does `--all` (every array it serves). Refused while clients of the array
/// (with `--all`, of the server) are connected unless `--force`. Waits for the stop.
pub fn run_stop(args: StopArgs) -> Result<()> {
    let path = match find_control(args.control, args.name.as_deref()) {
        // Found by review: `--all` still asked which array, as if it meant one.
        Err(e) if args.all && e.to_string().starts_with(SEVERAL_ARRAYS) => bail!(
            "{SEVERAL_ARRAYS}, maybe by several servers: name any array of the server to stop \
             with --name or --control (--all then stops every array that server serves)"
        ),
        found => found?,
    };
    let force = if args.force { " force" } else { "" };
    let v = if args.all {
        ask(&path, &format!("stop{force}"))?
    } else {
        let wait = match args.wait_s {
            0 => ARRAY_STOP_REFUSAL_WAIT,
            s => Duration::from_secs(s),
        };
        let name = path.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into());
        match ask_waiting(&path, &format!("stop-array{force}"), wait) {
            Ok(v) => v,
            // The stop goes on in the server after the CLI stops waiting (found by review:
            // a slow drain read as "no reply from the server", a failure).
            Err(e) if is_reply_timeout(&e) && args.wait_s == 0 => {
                println!(
                    "array {name} is stopping (its connections draining, then its flush); \
                     `flashraid status` or the server's log says when it has stopped"
                );
                return Ok(());
            }
            Err(e) if is_reply_timeout(&e) => bail!(
                "array {name} is still stopping after {} s (its connections draining, or its \
                 flush); the stop goes on in the server, whose log says when it has stopped",
                args.wait_s
            ),
            Err(e) if e.to_string().contains("unknown command") => bail!(
                "{e:#}\nthis server cannot stop one array alone (an older version): `flashraid \
                 stop --all` stops it with every array it serves"
            ),
            Err(e) => return Err(e),
        }
    };
    if let Some(name) = v["array_stopped"].as_str() {
        let how = match v["stopped"].as_str() {
            Some("clean") => "its connections drained, flushed and marked clean",
            Some("untouched") => "it was served read-only, so nothing was written to its members",
            // A member stalled or failed to flush: said by the server's log too.
            _ => "it stopped DIRTY (see the server's log): its next start resyncs it",
        };
        let serving: Vec<&str> = v["serving"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        println!(
            "array {name} stopped: {how}; the server (pid {}) serves on: {}",
            v["pid"],
            serving.join(", ")
        );
        return Ok(());
    }
    let arrays: Vec<&str> = v["arrays"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let served =
        if arrays.is_empty() { String::new() } else { format!(" (arrays {})", arrays.join(", ")) };
    if args.wait_s == 0 {
        println!("the server is stopping{served}");
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    // The process, not the control socket: the socket goes before the arrays are flushed
    // (found by review: the CLI said they were flushed while the server still ran).
    let Some(pid) = v["pid"].as_u64() else {
        bail!("the server did not say its process id; it is stopping{served}");
    };
    while process_running(pid) {
        if Instant::now() >= deadline {
            bail!(
                "the server (pid {pid}) was asked to stop{served} but is still running after \
                 {} s (connections still draining?); `flashraid status` shows it",
                args.wait_s
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let how = if v["read_only"].as_bool().unwrap_or(false) {
        "it served read-only, so nothing was written to the members"
    } else {
        // Not "marks every array clean": one with a stalled member, or failed, stops dirty
        // (found by review); the server's log says which.
        "it drained and flushed as on SIGTERM; its log says whether each array stopped clean"
    };
    println!("the server (pid {pid}) has exited{served}: {how}");
    Ok(())
}

/// Whether process `pid` still runs: it has a `/proc` entry that is not a zombie (a server
/// started from a shell stays a zombie until the shell waits for it).
fn process_running(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X")),
        Err(_) => false,
    }
}

pub fn run_fail(args: FailArgs) -> Result<()> {
    let path = find_control(args.control, args.name.as_deref())?;
    let force = if args.force { " force" } else { "" };
    ask(&path, &format!("fail {}{force}", args.role))?;
    let v = ask(&path, "status")?;
    println!("{}", fail_report(args.role, &v));
    Ok(())
}

/// What `fail ROLE` did, from the status that followed it: the array failed, a hot spare took
/// the role over (or already has), or the array runs degraded.
fn fail_report(role: usize, v: &Value) -> String {
    if v["failed"].as_bool() == Some(true) {
        return format!(
            "member {role} is failed; the array has FAILED: more members are out of service \
             than {} survives, writes are refused and reads of lost data return errors. To \
             bring it back, stop it and start it with --force (which brings back the devices \
             of failed members, the last to fail first)",
            v["level"].as_str().unwrap_or("its level")
        );
    }
    let rebuild = rebuild_line(&v["rebuild"]);
    if v["rebuild"]["role"].as_u64() == u64::try_from(role).ok() {
        let line = rebuild.unwrap_or_default();
        return format!("member {role} is failed; a hot spare took over\n{line}");
    }
    let member = &v["members"][role];
    if member["health"] == "active" {
        // A spare took the role over and its rebuild ended before `status` was asked.
        let device = member["path"].as_str().unwrap_or("?");
        return format!("member {role} is failed; hot spare {device} took over and is rebuilt");
    }
    let degraded = format!("member {role} is failed; the array runs degraded until it is replaced");
    match rebuild {
        Some(line) => format!("{degraded}\n{line}"),
        None => degraded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashraid_control::Init;
    use flashraid_layout::Level;
    use flashraid_runtime::{CreateSpec, MemMember, OpenOptions};
    use std::time::Instant;

    /// Found by a misuse test: a stored name with a `/` (`../x`, `/x`, `a/b`) put the control
    /// socket outside `--control-dir`. Such a name is refused, naming `--control`; any
    /// other name's socket is a file right in the directory.
    #[test]
    fn a_control_socket_is_never_made_outside_the_control_dir() {
        let dir = Path::new("/run/flashraid-test");
        for bad in ["../x", "/x", "a/b", "x/", "/", "a\0b"] {
            let e = control_path_in(dir, bad).unwrap_err().to_string();
            assert!(e.contains("--control PATH"), "{bad:?}: {e}");
        }
        for good in ["x", ".", "..", "-x", "...", "naïve"] {
            let path = control_path_in(dir, good).unwrap();
            assert_eq!(path.parent(), Some(dir), "{good:?}");
            assert_eq!(path.file_name().unwrap(), &*format!("{good}.control"), "{good:?}");
        }
    }

    /// A served in-memory array: its control socket answers in a thread until dropped.
    struct Served {
        path: PathBuf,
        stop: Arc<AtomicBool>,
        /// The NBD connections the server says are open.
        connections: Arc<std::sync::atomic::AtomicUsize>,
        /// Set when a `stop` asked the server to stop.
        stop_asked: Arc<AtomicBool>,
        thread: Option<std::thread::JoinHandle<()>>,
        _dir: tempfile::TempDir,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            if let Some(t) = self.thread.take() {
                t.join().unwrap();
            }
        }
    }

    /// An in-memory array of `count` 16 MiB members and `spares` hot spares behind a control
    /// socket; `rebuild_rate` in bytes per second (1: a crawl, 0: no limit).
    fn serve_memory(level: Level, count: usize, spares: usize, rebuild_rate: u64) -> Served {
        let mib16 = 16 << 20;
        let members: Vec<Arc<MemMember>> =
            (0..count).map(|i| MemMember::new(&format!("m{i}"), mib16)).collect();
        let spares: Vec<Arc<MemMember>> =
            (0..spares).map(|i| MemMember::new(&format!("spare{i}"), mib16)).collect();
        let spec = CreateSpec::in_memory("t", level, 16384, 1);
        flashraid_runtime::create_in_memory_with_spares(&spec, &members, &spares).unwrap();
        let mut options = OpenOptions::recommended();
        options.shards = Some(1);
        options.session_buffer_bytes = 4 << 20;
        options.config.rebuild_rate_bytes_per_s = rebuild_rate;
        let all: Vec<Arc<MemMember>> = members.iter().chain(&spares).cloned().collect();
        let array = Array::open_in_memory(&all, &options).unwrap();
        serve_array(array, tempfile::tempdir().unwrap())
    }

    /// A RAID level `level` array of `count` 24 MiB member files `m0..` in a new directory,
    /// behind a control socket; `rebuild_rate` as for `serve_memory`.
    fn serve_files(level: Level, count: usize, rebuild_rate: u64) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<PathBuf> = (0..count).map(|i| dir.path().join(format!("m{i}"))).collect();
        let spec = CreateSpec {
            members: members.clone(),
            create_files_bytes: Some(24 << 20),
            ..CreateSpec::in_memory("t", level, 16384, 1)
        };
        flashraid_runtime::create(&spec).unwrap();
        let mut options = OpenOptions::recommended();
        options.shards = Some(1);
        options.session_buffer_bytes = 4 << 20;
        options.ring_entries = 64;
        options.config.rebuild_rate_bytes_per_s = rebuild_rate;
        serve_array(Array::open(&members, &options).unwrap(), dir)
    }

    fn serve_array(array: Array, dir: tempfile::TempDir) -> Served {
        let array = Arc::new(array);
        let path = dir.path().join("t.control");
        let listener = bind(&path).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_asked = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let context = ControlContext {
            name: "t".into(),
            array,
            connections: Box::new({
                let connections = connections.clone();
                move || connections.load(Ordering::SeqCst)
            }),
            // One array: its connections are the server's.
            array_connections: Box::new({
                let connections = connections.clone();
                move || connections.load(Ordering::SeqCst)
            }),
            exports: Box::new(|| vec!["t".to_string()]),
            request_stop: Box::new({
                let asked = stop_asked.clone();
                move || asked.store(true, Ordering::SeqCst)
            }),
            // The server serves this array only: stopping it stops the server.
            stop_array: Box::new(|_| ArrayStop::OnlyArray),
            start_array: Box::new(|_| Err("no other array starts in this test".into())),
        };
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || serve(listener, context, stop)
        });
        Served { path, stop, connections, stop_asked, thread: Some(thread), _dir: dir }
    }

    /// The control socket fails members and stops the server: only its owner may connect
    /// (it is linked into place once 0600, so it is never reachable with the umask's mode).
    #[test]
    fn the_control_socket_is_its_owners_alone_from_the_start() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.control");
        let _listener = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.control"], "nothing left behind but the socket");
    }

    /// `flashraid stop` waits for the server's process: running is running, a zombie (a
    /// server its shell has not waited for yet) and no process are gone.
    #[test]
    fn a_stopped_server_is_seen_gone_also_as_a_zombie() {
        assert!(process_running(u64::from(std::process::id())));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = u64::from(child.id());
        let started = Instant::now();
        while process_running(pid) {
            assert!(started.elapsed() < Duration::from_secs(5), "an exited child still runs");
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(!process_running(pid));
    }

    /// One raw command line sent, the reply read.
    fn raw_command(path: &Path, line: &[u8]) -> Value {
        let mut stream = UnixStream::connect(path).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // The server may answer and close before it read everything (a line too long).
        let _ = stream.write_all(line);
        let mut reply = String::new();
        BufReader::new(stream).read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply {reply:?}: {e}"))
    }

    /// A command line longer than the socket takes is refused whole, never cut and carried
    /// out (found by review: cut at 4096 bytes, `spare add --force` of a 4090-byte path
    /// added and overwrote the file named by its first 4074 bytes); one that is not UTF-8
    /// gets an error reply (it got none); and `spare add` names no path that is not UTF-8
    /// (a lossy conversion named another file, which became the spare).
    #[test]
    fn overlong_and_non_utf8_command_lines_are_refused_whole() {
        let served = serve_memory(Level::Raid5, 3, 0, 0);
        let before = ask(&served.path, "status").unwrap();
        let mut long = b"spare-remove /".to_vec();
        long.resize(COMMAND_BYTES_MAX + 100, b'n');
        long.push(b'\n');
        let v = raw_command(&served.path, &long);
        let e = v["error"].as_str().unwrap_or_default();
        assert!(e.contains("longer than") && e.contains("nothing done"), "{v}");
        let v = raw_command(&served.path, b"status\xff\n");
        let e = v["error"].as_str().unwrap_or_default();
        assert!(e.contains("not UTF-8"), "{v}");
        let after = ask(&served.path, "status").unwrap();
        assert!(before["members"].is_array(), "{before}");
        assert_eq!(before["spares"], after["spares"]);
        assert_eq!(before["members"], after["members"]);
        // The CLI's side: too long to send, or not UTF-8, refused before it connects.
        let command = format!("spare-remove /{}", "n".repeat(COMMAND_BYTES_MAX));
        let e = ask(&served.path, &command).unwrap_err().to_string();
        assert!(e.contains("longer than the control socket takes"), "{e}");
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/s\xff"));
        let e = utf8_path(odd).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }

    /// `stop` is refused while NBD clients are connected (like `mdadm --stop` of an array in
    /// use), with nothing done; `stop force`, or no connection, asks the server to stop.
    #[test]
    fn stop_is_refused_while_clients_are_connected_unless_forced() {
        let served = serve_memory(Level::Raid5, 3, 0, 0);
        served.connections.store(2, Ordering::SeqCst);
        let e = ask(&served.path, "stop").unwrap_err().to_string();
        assert!(e.contains("2 NBD connection(s) are open") && e.contains("--force"), "{e}");
        assert!(!served.stop_asked.load(Ordering::SeqCst), "a refused stop stopped the server");
        ask(&served.path, "stop force").unwrap();
        assert!(served.stop_asked.load(Ordering::SeqCst), "a forced stop did not stop");
        served.stop_asked.store(false, Ordering::SeqCst);
        served.connections.store(0, Ordering::SeqCst);
        ask(&served.path, "stop").unwrap();
        assert!(served.stop_asked.load(Ordering::SeqCst), "a stop with no client did not stop");
        assert!(ask(&served.path, "stop now").is_err(), "an unknown stop option was taken");
        // `stop-array` of a server's only array is the server's stop, refused alike.
        served.stop_asked.store(false, Ordering::SeqCst);
        served.connections.store(1, Ordering::SeqCst);
        let e = ask(&served.path, "stop-array").unwrap_err().to_string();
        assert!(e.contains("1 NBD connection(s) are open") && e.contains("--force"), "{e}");
        assert!(!served.stop_asked.load(Ordering::SeqCst), "a refused stop stopped the server");
        let v = ask(&served.path, "stop-array force").unwrap();
        assert!(served.stop_asked.load(Ordering::SeqCst), "{v}");
        assert_eq!(v["arrays"], json!(["t"]), "{v}");
        assert!(ask(&served.path, "stop-array now").is_err(), "an unknown stop option was taken");
    }

    /// Found by review: a client sending a byte at a time, never a newline, was not timed
    /// out (the wait was checked only when a read timed out), so sixteen of them kept every
    /// command "busy" for minutes. Each is closed after the command wait.
    #[test]
    fn a_dribbling_client_is_closed_after_the_command_wait() {
        let served = serve_memory(Level::Raid1, 2, 0, 0);
        let mut slow = idle_clients(&served.path, CONTROL_CONNECTIONS_MAX);
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(COMMAND_WAIT_MS_MAX + 1500) {
            for s in &mut slow {
                let _ = s.write_all(b" ");
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        let r = ask(&served.path, "status");
        assert!(r.is_ok(), "still busy {:?} after the clients connected: {r:?}", started.elapsed());
    }

    /// Connect `count` clients that send nothing, and give the server time to take them.
    fn idle_clients(path: &Path, count: usize) -> Vec<UnixStream> {
        let idle = (0..count).map(|_| UnixStream::connect(path).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(300));
        idle
    }

    /// Found by review: connections were served one at a time, each waiting up to 5 s for
    /// its command line, so two clients that connected and sent nothing held `status` back
    /// for 10 s. Now `status` answers at once beside them, and a stop waits for neither.
    #[test]
    fn status_answers_while_other_connections_idle() {
        let served = serve_memory(Level::Raid5, 3, 0, 0);
        let idle = idle_clients(&served.path, 2);
        let started = Instant::now();
        let status = ask(&served.path, "status").unwrap();
        let waited = started.elapsed();
        assert_eq!(status["state"], "optimal", "{status}");
        assert!(waited < Duration::from_secs(1), "status took {waited:?} beside idle clients");
        let started = Instant::now();
        drop(served);
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(1), "the stop took {waited:?} beside idle clients");
        drop(idle);
    }

    /// Past `CONTROL_CONNECTIONS_MAX` open connections one more is told the socket is busy
    /// (not left waiting); once the idle ones close, commands are served again.
    #[test]
    fn a_connection_past_the_maximum_is_told_the_socket_is_busy() {
        let served = serve_memory(Level::Raid1, 2, 0, 0);
        let idle = idle_clients(&served.path, CONTROL_CONNECTIONS_MAX);
        let e = ask(&served.path, "status").unwrap_err().to_string();
        assert!(e.contains("the control socket is busy") && e.contains("try again"), "{e}");
        drop(idle);
        let started = Instant::now();
        while let Err(e) = ask(&served.path, "status") {
            assert!(started.elapsed() < Duration::from_secs(2), "still refused: {e}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every key the unknown-tunable error lists is one `tune` takes, and every key it takes
    /// is listed (found by review: `member-timeout-ms` was taken but not listed).
    #[test]
    fn the_tunables_listed_are_the_tunables_taken() {
        let served = serve_memory(Level::Raid5, 3, 0, 0);
        let e = ask(&served.path, "tune no-such-key 1").unwrap_err().to_string();
        let list = e.split("try ").nth(1).unwrap_or_else(|| panic!("no list of keys: {e}"));
        let listed: Vec<&str> =
            list.split([',', ' ']).filter(|w| !w.is_empty() && *w != "or").collect();
        let taken: Vec<&str> = TUNE_KEYS.iter().map(|(name, _)| *name).collect();
        assert_eq!(listed, taken, "{e}");
        for key in listed {
            let value = match key {
                "resync-rate" | "scrub-rate" => 1 << 20,
                "scrub-every-hours" | "merge-window-us" => 0,
                "shards" => 1,
                "queue-depth" => 64,
                "member-timeout-ms" => 60_000,
                _ => panic!("the test has no valid value for {key}"),
            };
            ask(&served.path, &format!("tune {key} {value}"))
                .unwrap_or_else(|e| panic!("tune {key} {value}: {e}"));
        }
    }

    /// `fail` past the tolerance is refused with nothing changed; `force` does it, and the
    /// report says the array FAILED (found by a misuse test: "runs degraded" was printed,
    /// and on RAID 1 the command failed although the member was failed).
    #[test]
    fn fail_past_the_tolerance_needs_force_and_is_reported_truthfully() {
        let served = serve_memory(Level::Raid1, 2, 0, 0);
        let path = &served.path;
        ask(path, "fail 0").unwrap();
        let report = fail_report(0, &ask(path, "status").unwrap());
        assert!(report.contains("runs degraded"), "{report}");
        let e = ask(path, "fail 1").unwrap_err().to_string();
        assert!(e.contains("refusing to fail member 1") && e.contains("--force"), "{e}");
        let status = ask(path, "status").unwrap();
        assert_eq!(status["members"][1]["health"], "active", "{status}");
        assert_eq!(status["state"], "degraded", "{status}");
        ask(path, "fail 1 force").unwrap();
        let report = fail_report(1, &ask(path, "status").unwrap());
        assert!(report.contains("the array has FAILED"), "{report}");
        assert!(!report.contains("degraded"), "{report}");
        let e = ask(path, "fail 1 now").unwrap_err().to_string();
        assert!(e.contains("unknown command"), "{e}");
    }

    /// `fail ROLE` twice: the second is refused naming the spare that took the role over;
    /// `force` fails that spare (found by a misuse test: the spare was failed silently).
    #[test]
    fn a_second_fail_of_a_role_names_the_spare_that_took_it_over() {
        let served = serve_memory(Level::Raid5, 3, 1, 1);
        let path = &served.path;
        ask(path, "fail 0").unwrap();
        let report = fail_report(0, &ask(path, "status").unwrap());
        assert!(report.contains("a hot spare took over"), "{report}");
        let e = ask(path, "fail 0").unwrap_err().to_string();
        assert!(e.contains("role 0 is being rebuilt onto spare0") && e.contains("--force"), "{e}");
        let status = ask(path, "status").unwrap();
        assert_eq!(status["members"][0]["path"], "spare0", "{status}");
        assert_eq!(status["state"], "rebuilding", "{status}");
        ask(path, "fail 0 force").unwrap();
        let report = fail_report(0, &ask(path, "status").unwrap());
        assert!(report.contains("runs degraded"), "{report}");
    }

    /// A member fails during a rebuild and the array fails past its tolerance (the role
    /// being rebuilt counts as out): `fail` and the status's rebuild line say so and name
    /// `--force`, not "too many members unreadable" (found by review).
    #[test]
    fn a_rebuild_stalled_by_a_failed_array_says_why_and_the_way_back() {
        let served = serve_memory(Level::Raid5, 3, 1, 1 << 20);
        let path = &served.path;
        ask(path, "fail 0").unwrap();
        wait_for_state(path, "rebuilding");
        ask(path, "fail 1 force").unwrap();
        let report = fail_report(1, &ask(path, "status").unwrap());
        assert!(report.contains("the array has FAILED") && report.contains("--force"), "{report}");
        for _ in 0..3000 {
            let v = ask(path, "status").unwrap();
            if !v["rebuild"]["stalled_at_stripe"].is_null() {
                assert_eq!(v["state"], "failed", "{v}");
                let line = rebuild_line(&v["rebuild"]).unwrap();
                assert!(line.contains("failed past its tolerance"), "{line}");
                assert!(line.contains("start it with --force"), "{line}");
                assert!(!line.contains("unreadable"), "{line}");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no stall: {}", ask(path, "status").unwrap());
    }

    /// A file of a member's size in the served array's directory; its absolute path.
    fn blank(served: &Served, name: &str) -> String {
        let path = served.path.with_file_name(name);
        std::fs::File::create(&path).unwrap().set_len(24 << 20).unwrap();
        path.display().to_string()
    }

    fn wait_for_state(path: &Path, state: &str) -> Value {
        for _ in 0..3000 {
            let v = ask(path, "status").unwrap();
            if v["state"] == state {
                return v;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("not {state}: {}", ask(path, "status").unwrap());
    }

    /// `spare add` says what became of the device (found by a misuse test): added as a spare
    /// during a rebuild it is queued, not "took over a failed member"; a failed member's own
    /// device given back takes its role (not "added as a hot spare"); an active member is
    /// refused as one, not as "named twice".
    #[test]
    fn spare_add_says_what_became_of_the_device() {
        // RAID 6 rebuilding at a crawl: member 0's takeover runs while member 1 fails.
        let served = serve_files(Level::Raid6, 4, 1);
        let path = &served.path;
        let members: Vec<String> = (0..4)
            .map(|i| served.path.with_file_name(format!("m{i}")).display().to_string())
            .collect();
        ask(path, "fail 0").unwrap();
        let first = blank(&served, "first");
        ask(path, &format!("spare-add keep readd {first}")).unwrap();
        let report = spare_add_report(&first, &ask(path, "status").unwrap());
        assert!(report.contains("took over failed member 0"), "{report}");
        ask(path, "fail 1").unwrap();
        let second = blank(&served, "second");
        ask(path, &format!("spare-add keep readd {second}")).unwrap();
        let report = spare_add_report(&second, &ask(path, "status").unwrap());
        assert!(report.contains("added as a hot spare"), "{report}");
        assert!(report.contains("takes over failed member 1 once the running"), "{report}");
        assert!(!report.contains("took over"), "{report}");
        let e = ask(path, &format!("spare-add keep readd {}", members[2])).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("already an active member of this array, of role 2"), "{e}");
        assert!(!e.contains("named twice"), "{e}");
        drop(served);

        // A failed member's own device given back in full takes its role back.
        let served = serve_files(Level::Raid5, 3, 0);
        let path = &served.path;
        let m2 = served.path.with_file_name("m2").display().to_string();
        ask(path, "fail 2").unwrap();
        ask(path, &format!("spare-add keep full {m2}")).unwrap();
        let report = spare_add_report(&m2, &wait_for_state(path, "optimal"));
        assert!(report.contains("took over failed member 2, rebuilt already"), "{report}");
        assert!(!report.contains("hot spare"), "{report}");
    }

    /// Messages about a RAID 1 say nothing of parity.
    #[test]
    fn messages_about_mirrors_do_not_say_parity() {
        let served = serve_memory(Level::Raid1, 3, 1, 1);
        let path = &served.path;
        ask(path, "fail 0").unwrap();
        wait_for_state(path, "rebuilding");
        let e = ask(path, "scrub check").unwrap_err().to_string();
        assert!(e.contains("mirror copies cannot be checked") && !e.contains("parity"), "{e}");
        for level in [Level::Raid1, Level::Raid10] {
            for init in [Init::Zero, Init::Background] {
                let line = crate::array_cmds::init_line(init, level);
                assert!(line.contains("mirror copies") && !line.contains("parity"), "{line}");
            }
        }
        let line = crate::array_cmds::init_line(Init::Zero, Level::Raid6);
        assert!(line.contains("parity"), "{line}");
    }
}
