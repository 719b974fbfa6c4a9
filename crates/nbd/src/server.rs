//! The NBD server: listeners, the handshake, and one event loop per connection.
//!
//! Owns: sockets and the threads that serve them (one per listener, one per connection; no
//! thread per request). A connection's loop owns one array session: it reads requests
//! without blocking, submits them (many in flight), assembles read replies as the pieces
//! arrive, and writes replies in completion order. It sleeps in `poll(2)` on the socket and
//! the session's notify descriptor, so an idle connection costs nothing.
//!
//! Invariants: a request is answered exactly once, after the engine finished it (so a write
//! acknowledged to the client is in the engine, and FUA/flush semantics are the engine's);
//! bytes from the client never size an allocation beyond `REQUEST_BYTES_MAX`; a protocol
//! violation closes the connection, and requests already submitted still finish in the
//! engine (the array stays consistent; only the replies are lost).
//!
//! Limits: `CONNECTIONS_MAX` connections per server; `CONNECTION_REQUESTS_MAX` requests in
//! flight per connection; `REQUEST_BYTES_MAX` per request; replies not yet written at most
//! `REPLY_BACKLOG_BYTES_MAX` (beyond it, no new request is read); read buffers (in flight
//! and not yet written) at most `READ_BUFFERS_BYTES_MAX` beyond one request (beyond it, a
//! read waits for earlier replies to be written); negotiation within `HANDSHAKE_TIMEOUT`, and
//! once the server stops, within `STOP_NEGOTIATION_GRACE` (options then get
//! `NBD_REP_ERR_SHUTDOWN`). Exports can be withdrawn one at a time while the server runs
//! (`ServedExports::withdraw`: one array of several stopped while the others serve on): the
//! export leaves the list under the catalog's lock, which is also where a handshake claims
//! it, so no new connection reaches it afterwards, and the withdrawal returns once every
//! connection that claimed it has ended and let go of the array. A read's reply is
//! assembled in its slot, whose buffer is kept for the next request up to 1 MiB
//! (`KEEP_BUFFER_BYTES`): reads larger than that allocate their buffer per request, the price
//! of not pinning 8 MiB per slot. Simple replies only (structured replies are refused; every
//! client falls back). TLS (`crate::tls`), when configured, is required before anything else.

use crate::proto::{self, Decoded};
use flashraid_engine::{ArrayOp, Durability, RequestError};
use flashraid_layout::ArrayOffset;
use flashraid_runtime::{Array, ArrayError, Event, Session, SubmitError};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connections one server serves at once. Each holds its session's buffers
/// (`OpenOptions::session_buffer_bytes`, 32 MiB by default) while it lives.
pub const CONNECTIONS_MAX: usize = 128;
/// Requests in flight per connection.
pub const CONNECTION_REQUESTS_MAX: usize = 128;
/// Largest read or write (the block size maximum advertised to clients). A request this
/// large must fit in a session's buffers with room to spare; clients split larger ones.
pub const REQUEST_BYTES_MAX: u32 = 8 << 20;
/// A client has this long to finish negotiating.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Once the server stops, a client still negotiating has this long to send its next option,
/// which is answered `NBD_REP_ERR_SHUTDOWN` (an `NBD_OPT_ABORT`, the client's answer to that,
/// is acknowledged), before it is closed: the spec's SHOULD, bounded so that a silent client
/// does not hold the stop for longer.
pub const STOP_NEGOTIATION_GRACE: Duration = Duration::from_secs(1);
/// After the server is told to stop, how long a connection may take to finish its requests
/// and write their replies before its socket is treated as dead.
pub const STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Buffers grown beyond this by one large request are given back once it is answered.
const KEEP_BUFFER_BYTES: usize = 1 << 20;
/// A connection's read buffers (reads in flight, replies waiting for the socket, and the
/// buffers free slots keep), at most, beyond one request: a read that would pass it waits
/// until earlier replies are written (found by review: a client sending 8 MiB reads without
/// reading the replies made the server hold 1 GiB per connection).
pub const READ_BUFFERS_BYTES_MAX: usize = 64 << 20;
/// The receive buffer's usual size (it grows to hold one whole large write).
const RBUF_BYTES: usize = 256 << 10;
/// A write payload at least this large that has not fully arrived is read from the socket
/// straight into the session's buffers (one copy less than through the receive buffer).
const DIRECT_PAYLOAD_BYTES_MIN: usize = 32 << 10;
/// After such a write, the receive buffer reads this much at most, so the next large
/// payload mostly stays in the socket for the direct path; small requests still batch.
const RBUF_READ_AFTER_LARGE_BYTES: usize = 4 << 10;
/// A client that sent a write's header must send its payload within this time.
const PAYLOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Reply bytes waiting for the socket before the connection stops reading requests.
pub const REPLY_BACKLOG_BYTES_MAX: usize = 64 << 20;
/// Smallest request alignment (the engine's block).
pub const BLOCK_BYTES_MIN: u32 = 4096;
/// Trim and write-zeroes have no payload, so clients send them as large as the export (the
/// block size maximum bounds payloads only). The engine gets them in steps of this size, one
/// at a time per request, which bounds the pieces a session has in flight.
pub const RANGE_STEP_BYTES: u64 = 256 << 20;
/// How long a connection with requests in flight polls before it sleeps in `poll(2)`.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);
/// How often sleeping loops look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);

/// One array exported by name.
#[derive(Clone, Debug)]
pub struct Export {
    pub name: String,
    pub read_only: bool,
    pub array: Arc<Array>,
}

/// What a server exports, and how.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// Each with a distinct name. A client asking for the default export ("") gets the only
    /// one, when there is only one.
    pub exports: Vec<Export>,
    /// When set, TLS is required: clients must STARTTLS before anything else.
    pub tls: Option<crate::tls::TlsSetup>,
    /// Serve each connection on a thread of its own after the handshake, as TLS
    /// connections always are. Otherwise (the default) a connection's requests are read,
    /// submitted and answered inside a reactor, as one of its jobs.
    pub connection_threads: bool,
}

impl ExportConfig {
    /// One array under one name.
    pub fn single(name: &str, array: Arc<Array>, read_only: bool) -> ExportConfig {
        ExportConfig {
            exports: vec![Export { name: name.to_string(), read_only, array }],
            tls: None,
            connection_threads: false,
        }
    }
}

/// The exports a running server offers now, and each one's connections. Every lookup takes
/// the lock, copies what it needs and lets go: no handshake holds an `Arc<Array>` across
/// socket IO, so a withdrawn array is held only by the connections that claimed it.
#[derive(Debug)]
struct Catalog {
    offered: Mutex<Vec<Offered>>,
    /// Whether a client asking for "" gets the only export: decided at the start (one export
    /// then), so an export left alone by a withdrawal does not become the default of a
    /// client that a server of several refused before; given up for good when another is
    /// offered (found by review: the first withdrawn, "" reached the one offered later).
    /// Read and written under `offered`'s lock.
    default_export: AtomicBool,
    /// The server stops: nothing more is offered (a connection that claimed an export offered
    /// after `stop_all` would never be told to end). Set under `offered`'s lock.
    stopped: AtomicBool,
    tls: Option<crate::tls::TlsSetup>,
    connection_threads: bool,
}

/// One export in the catalog.
#[derive(Debug)]
struct Offered {
    export: Export,
    /// Connections past their handshake that hold a [`Claim`] on it.
    connections: Arc<AtomicUsize>,
    /// Tells them to end: set when it is withdrawn, and when the server stops.
    stop: Arc<AtomicBool>,
}

/// What a handshake option tells of an export, copied out under the catalog's lock.
struct Described {
    name: String,
    size_bytes: u64,
    read_only: bool,
    preferred_block: u32,
}

impl Described {
    fn of(export: &Export) -> Described {
        Described {
            name: export.name.clone(),
            size_bytes: export.array.size_bytes(),
            read_only: export.read_only,
            preferred_block: preferred_block(&export.array),
        }
    }
}

/// A connection's hold on its export, from the end of its handshake until it ends. Fields
/// drop in order, the count last: once the export's count is 0, no connection holds its
/// array.
struct Claim {
    export: Export,
    stop: Arc<AtomicBool>,
    _counted: Counted,
}

impl Catalog {
    fn new(config: ExportConfig) -> Catalog {
        let offered: Vec<Offered> = config
            .exports
            .into_iter()
            .map(|export| Offered {
                export,
                connections: Arc::new(AtomicUsize::new(0)),
                stop: Arc::new(AtomicBool::new(false)),
            })
            .collect();
        Catalog {
            default_export: AtomicBool::new(offered.len() == 1),
            stopped: AtomicBool::new(false),
            offered: Mutex::new(offered),
            tls: config.tls,
            connection_threads: config.connection_threads,
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Offered>> {
        self.offered.lock().expect("no thread panics holding the catalog")
    }

    fn find<'a>(&self, list: &'a [Offered], asked: &str) -> Option<&'a Offered> {
        match list {
            [only] if asked.is_empty() && self.default_export.load(Ordering::SeqCst) => Some(only),
            list => list.iter().find(|o| o.export.name == asked),
        }
    }

    fn names(&self) -> Vec<String> {
        self.list().iter().map(|o| o.export.name.clone()).collect()
    }

    fn describe(&self, asked: &str) -> Option<Described> {
        let list = self.list();
        self.find(&list, asked).map(|o| Described::of(&o.export))
    }

    /// Count a connection on export `asked`, under the lock a withdrawal takes too.
    fn claim(&self, asked: &str) -> Option<Claim> {
        let list = self.list();
        let offered = self.find(&list, asked)?;
        offered.connections.fetch_add(1, Ordering::SeqCst);
        Some(Claim {
            export: offered.export.clone(),
            stop: offered.stop.clone(),
            _counted: Counted(offered.connections.clone()),
        })
    }

    /// Tell every connection to end (the server stops).
    fn stop_all(&self) {
        let list = self.list();
        self.stopped.store(true, Ordering::SeqCst);
        for offered in list.iter() {
            offered.stop.store(true, Ordering::SeqCst);
        }
    }
}

/// Whether [`ServedExports::withdraw`] may end connections that use the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Withdrawal {
    /// Refused, with nothing changed, while a connection uses it.
    IfUnused,
    /// Its connections are told to end (their requests in flight finish and are answered).
    Force,
}

/// Why an export was not withdrawn.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WithdrawError {
    #[error("no export named {0:?} is served")]
    Unknown(String),
    #[error("{0} NBD connection(s) to it are open")]
    InUse(usize),
}

/// Why an export was not offered.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    #[error("an export named {0:?} is served already")]
    Taken(String),
    #[error("the server is stopping")]
    Stopping,
}

/// The exports of a running server, for other threads (the control sockets): what is
/// offered, how many connections use each, taking one out while the others serve on, and
/// offering another.
#[derive(Clone, Debug)]
pub struct ServedExports(Arc<Catalog>);

impl ServedExports {
    /// The names of the exports offered now.
    pub fn names(&self) -> Vec<String> {
        self.0.names()
    }

    /// Connections past their handshake using export `name`, if it is offered.
    pub fn connections(&self, name: &str) -> Option<usize> {
        let list = self.0.list();
        let offered = list.iter().find(|o| o.export.name == name)?;
        Some(offered.connections.load(Ordering::SeqCst))
    }

    /// Offer `export` beside the others from now on (an array started in the running
    /// server): the next client to ask for its name reaches it.
    /// With it there are two or more names over the server's life, so "" names no export
    /// from now on.
    pub fn offer(&self, export: Export) -> Result<(), OfferError> {
        let mut list = self.0.list();
        if self.0.stopped.load(Ordering::SeqCst) {
            return Err(OfferError::Stopping);
        }
        if list.iter().any(|o| o.export.name == export.name) {
            return Err(OfferError::Taken(export.name));
        }
        self.0.default_export.store(false, Ordering::SeqCst);
        list.push(Offered {
            export,
            connections: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        });
        Ok(())
    }

    /// Stop offering export `name`: it leaves the list at once (a client negotiating now no
    /// longer finds it), its connections are told to end as at the server's stop (requests
    /// in flight finish and are answered; a client that does not read its replies is given
    /// up after `STOP_DRAIN_TIMEOUT`), and this returns the export once every one of them
    /// has ended and let go of its array. With [`Withdrawal::IfUnused`] a connection using
    /// it refuses the withdrawal, with nothing changed.
    pub fn withdraw(&self, name: &str, how: Withdrawal) -> Result<Export, WithdrawError> {
        let offered = {
            let mut list = self.0.list();
            let index = list
                .iter()
                .position(|o| o.export.name == name)
                .ok_or_else(|| WithdrawError::Unknown(name.to_string()))?;
            // Claims are counted under this lock: the count read here is every connection
            // that has the export or can still get it.
            let open = list[index].connections.load(Ordering::SeqCst);
            if open > 0 && how == Withdrawal::IfUnused {
                return Err(WithdrawError::InUse(open));
            }
            list.remove(index)
        };
        offered.stop.store(true, Ordering::SeqCst);
        // Each connection ends within the stop's drain (its handshake's deadline, for one
        // that claimed the export and is still writing the reply).
        while offered.connections.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(offered.export)
    }
}

/// A socket stream either kind of listener gives, or TLS over one.
pub trait Stream: Read + Write + AsRawFd + Send {
    fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    /// Bytes are ready to read though the socket may not be readable (TLS: decrypted bytes
    /// waiting in the TLS layer).
    fn input_waiting(&self) -> bool {
        false
    }
    /// Bytes accepted by `write` still wait to go out (TLS: encrypted records).
    fn output_waiting(&self) -> bool {
        false
    }
    /// Send what `output_waiting` holds, as far as the socket takes it.
    fn send_waiting(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// The connection ends: say so in-band where the protocol has a way (TLS close_notify),
    /// best effort.
    fn close(&mut self) {}
}
impl Stream for UnixStream {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        UnixStream::set_nonblocking(self, on)
    }
}
impl Stream for TcpStream {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        let _ = self.set_nodelay(true);
        TcpStream::set_nonblocking(self, on)
    }
}

/// A listening socket.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// TCP keepalive on accepted connections: probes start after this much silence...
const TCP_KEEPALIVE_IDLE_S: i32 = 60;
/// ...go out this often...
const TCP_KEEPALIVE_INTERVAL_S: i32 = 10;
/// ...and this many unanswered end the connection: a peer that vanished (a crashed host, a
/// cut network) gives its connection slot back within about two minutes instead of holding
/// it for good (found by review: with no idle timeout, such slots were never freed).
const TCP_KEEPALIVE_PROBES: i32 = 6;
/// Replies the peer has not acknowledged for this long end the connection too: keepalive
/// probes only go out on an idle connection, and retransmissions to a vanished peer would
/// otherwise go on for about 15 minutes (found by review).
const TCP_USER_TIMEOUT_MS: i32 = 120_000;

/// Turn TCP keepalive on for `stream` (see `TCP_KEEPALIVE_*`).
fn set_keepalive(stream: &TcpStream) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, TCP_KEEPALIVE_IDLE_S),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, TCP_KEEPALIVE_INTERVAL_S),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, TCP_KEEPALIVE_PROBES),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS),
    ];
    for (level, name, value) in options {
        // SAFETY: `fd` is an open socket owned by `stream` for the duration of the call;
        // the option value is a valid c_int whose size is passed.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Listener {
    fn accept(&self) -> io::Result<Box<dyn Stream>> {
        match self {
            Listener::Unix(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Stream>),
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                if let Err(e) = set_keepalive(&s) {
                    // The connection works without it; only a vanished peer is noticed late.
                    eprintln!("flashraid serve: TCP keepalive not set on a connection: {e}");
                }
                Ok(Box::new(s) as Box<dyn Stream>)
            }
        }
    }
    fn fd(&self) -> RawFd {
        match self {
            Listener::Unix(l) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }
    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }
}

/// A running server: stop it with `stop`, then `join`.
#[derive(Debug)]
pub struct Server {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    connections: Arc<AtomicUsize>,
    catalog: Arc<Catalog>,
}

impl Server {
    /// Serve `exports` on `listeners` until `stop`.
    pub fn start(exports: ExportConfig, listeners: Vec<Listener>) -> io::Result<Server> {
        let catalog = Arc::new(Catalog::new(exports));
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let mut threads = vec![];
        for listener in listeners {
            listener.set_nonblocking()?;
            let (catalog, stop, connections) = (catalog.clone(), stop.clone(), connections.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("flashraid-nbd-accept".into())
                    .spawn(move || accept_loop(listener, catalog, stop, connections))?,
            );
        }
        Ok(Server { stop, threads, connections, catalog })
    }

    /// A handle on the exports, for other threads: what is offered, and withdrawing one.
    pub fn exports(&self) -> ServedExports {
        ServedExports(self.catalog.clone())
    }

    /// A handle on the number of open connections, for reporting from other threads.
    pub fn connection_counter(&self) -> Arc<AtomicUsize> {
        self.connections.clone()
    }

    /// Stop accepting; connections finish what is in flight, write their replies and close.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Past its handshake a connection watches its export's flag, which a withdrawal sets
        // too; one that claims an export after this finds the flag set already.
        self.catalog.stop_all();
    }

    /// Wait for every listener and connection to end (after `stop`); the exports are then
    /// let go (no `ServedExports` handle holds an array afterwards).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
        while self.connections.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let go of the arrays: a `ServedExports` handle may outlive the server, and the
        // caller's `Arc::try_unwrap` must find no other holder.
        self.catalog.list().clear();
    }
}

fn accept_loop(
    listener: Listener,
    catalog: Arc<Catalog>,
    stop: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
) {
    while !stop.load(Ordering::SeqCst) {
        if !wait_readable(listener.fd(), STOP_POLL) {
            continue;
        }
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                eprintln!("flashraid serve: accept failed: {e}");
                std::thread::sleep(STOP_POLL);
                continue;
            }
        };
        if connections.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
            connections.fetch_sub(1, Ordering::SeqCst);
            eprintln!("flashraid serve: {CONNECTIONS_MAX} connections already; refusing one");
            continue;
        }
        let (catalog, stop, count) = (catalog.clone(), stop.clone(), connections.clone());
        let spawned =
            std::thread::Builder::new().name("flashraid-nbd-conn".into()).spawn(move || {
                // Declared first, dropped last (also when unwinding): the count falls only
                // after this thread let go of the array, so `join` then `Arc::try_unwrap`
                // in the daemon cannot see a stale reference.
                let _counted = Counted(count);
                let catalog = catalog;
                if let Err(e) = serve_offered(stream, &catalog, &stop, EndsOn::ExportStop) {
                    eprintln!("flashraid serve: connection closed: {e}");
                }
            });
        if spawned.is_err() {
            connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Decrements the connection count when dropped.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(#[from] proto::ProtocolError),
    #[error("client does not speak fixed newstyle negotiation")]
    NotFixedNewstyle,
    #[error("client sent unknown handshake flags {0:#x}")]
    UnknownClientFlags(u32),
    #[error("client did not finish negotiating within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("client sent a write's header but not its payload within {0:?}")]
    PayloadTimeout(Duration),
    #[error("the server is stopping")]
    Stopping,
    #[error("client asked for the export without TLS, which this server requires")]
    TlsRequired,
    #[error("client asked for unknown export {0:?}")]
    UnknownExport(String),
    #[error("array: {0}")]
    Array(#[from] ArrayError),
}

/// Serve one client: handshake, then transmission until it disconnects or `stop` is set.
pub fn serve_connection(
    stream: Box<dyn Stream>,
    exports: &ExportConfig,
    stop: &AtomicBool,
) -> Result<(), ConnectionError> {
    serve_offered(stream, &Catalog::new(exports.clone()), stop, EndsOn::ServerStop)
}

/// Which flag ends a connection's transmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EndsOn {
    /// The caller's stop flag ([`serve_connection`]: no server, nothing is withdrawn).
    ServerStop,
    /// Its export's flag, which the server's stop and a withdrawal set ([`Server`]).
    ExportStop,
}

/// Serve one client of `catalog`: the handshake (ended by `stop`), then transmission.
fn serve_offered(
    stream: Box<dyn Stream>,
    catalog: &Catalog,
    stop: &AtomicBool,
    ends_on: EndsOn,
) -> Result<(), ConnectionError> {
    stream.set_nonblocking(true)?;
    let Some((stream, claim)) = handshake(stream, catalog, stop)? else {
        return Ok(());
    };
    let stop = match ends_on {
        EndsOn::ServerStop => stop,
        EndsOn::ExportStop => &*claim.stop,
    };
    let export = &claim.export;
    if catalog.tls.is_none() && !catalog.connection_threads {
        return serve_in_reactor(stream, export, stop);
    }
    let session = export.array.session_with_bell()?;
    Transmission::new(stream, session, &export.array, export.read_only).run(stop)
}

/// Transmission inside a reactor thread, as one of its jobs: no thread of this connection
/// between the socket and the engine. This thread only waits for the job to end and passes
/// the server's stop on to it.
fn serve_in_reactor(
    stream: Box<dyn Stream>,
    export: &Export,
    stop: &AtomicBool,
) -> Result<(), ConnectionError> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let index = NEXT.fetch_add(1, Ordering::Relaxed);
    let session = export.array.job_session(index)?;
    let mut transmission = Transmission::new(stream, session, &export.array, export.read_only);
    transmission.in_reactor = true;
    let job_stop = Arc::new(AtomicBool::new(false));
    let (result_tx, result_rx) = std::sync::mpsc::channel();
    let mut ending = Ending::default();
    let flag = job_stop.clone();
    let job: flashraid_runtime::ShardJob =
        Box::new(move || match transmission.step(&flag, &mut ending) {
            // Pieces a full inbox could not take yet wait in the session: no reply or
            // socket event would come for them.
            Step::Went { progress: false } if !transmission.session.has_queued() => {
                let (fd, events) = transmission.socket_events();
                if transmission.is_quiet() {
                    flashraid_runtime::JobStatus::Parked { fd, events }
                } else {
                    flashraid_runtime::JobStatus::Waiting { fd, events }
                }
            }
            Step::Went { .. } => flashraid_runtime::JobStatus::Running,
            Step::Done(result) => {
                let _ = result_tx.send(result);
                flashraid_runtime::JobStatus::Finished
            }
        });
    let done = export.array.start_job(index, job)?;
    loop {
        match done.recv_timeout(STOP_POLL) {
            Ok(Ok(())) => break,
            Ok(Err(e)) => return Err(ConnectionError::Array(ArrayError::Other(e))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::Relaxed) {
                    job_stop.store(true, Ordering::Relaxed);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(ConnectionError::Array(ArrayError::Stopped));
            }
        }
    }
    result_rx.try_recv().unwrap_or(Ok(()))
}

fn transmission_flags(read_only: bool) -> u16 {
    let mut flags = proto::TFLAG_HAS_FLAGS
        | proto::TFLAG_SEND_FLUSH
        | proto::TFLAG_SEND_FUA
        | proto::TFLAG_CAN_MULTI_CONN;
    if read_only {
        flags |= proto::TFLAG_READ_ONLY;
    } else {
        flags |= proto::TFLAG_SEND_TRIM | proto::TFLAG_SEND_WRITE_ZEROES;
    }
    flags
}

/// One full stripe of data rounded up to a power of two (the protocol requires one). When
/// the data chunks per stripe are a power of two that is exactly a stripe, written without
/// reads; otherwise a request that size still covers at least one whole stripe.
fn preferred_block(array: &Array) -> u32 {
    u32::try_from(array.geometry().stripe_data_bytes())
        .ok()
        .and_then(u32::checked_next_power_of_two)
        .unwrap_or(REQUEST_BYTES_MAX)
        .clamp(BLOCK_BYTES_MIN, REQUEST_BYTES_MAX)
}

/// Fixed newstyle negotiation over a non-blocking socket. Returns the stream to transmit on
/// (TLS after STARTTLS), or `None` when the client ended the negotiation cleanly (ABORT).
/// Once the server stops, options are refused with `NBD_REP_ERR_SHUTDOWN` for at most
/// `STOP_NEGOTIATION_GRACE`, until the client aborts or hangs up.
#[allow(clippy::type_complexity)]
fn handshake(
    mut stream: Box<dyn Stream>,
    exports: &Catalog,
    stop: &AtomicBool,
) -> Result<Option<(Box<dyn Stream>, Claim)>, ConnectionError> {
    let limit = Limit::new(stop, Instant::now() + HANDSHAKE_TIMEOUT, Some(STOP_NEGOTIATION_GRACE));
    let mut tls_active = false;
    write_full(&mut *stream, &proto::greeting(), &limit)?;
    let mut flags = [0u8; 4];
    read_full(&mut *stream, &mut flags, &limit)?;
    let client_flags = u32::from_be_bytes(flags);
    if client_flags & proto::CLIENT_FIXED_NEWSTYLE == 0 {
        return Err(ConnectionError::NotFixedNewstyle);
    }
    let known = proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES;
    if client_flags & !known != 0 {
        // The protocol: a server that does not understand a client flag must disconnect.
        return Err(ConnectionError::UnknownClientFlags(client_flags));
    }
    let no_zeroes = client_flags & proto::CLIENT_NO_ZEROES != 0;
    let mut out = Vec::with_capacity(256);
    loop {
        let mut header = [0u8; proto::OPTION_HEADER_BYTES];
        read_full(&mut *stream, &mut header, &limit)?;
        out.clear();
        let h = match proto::decode_option_header(&header) {
            Ok(Decoded::Item(h, _)) => h,
            Ok(Decoded::Incomplete) => unreachable!("a whole header was read"),
            Err(proto::ProtocolError::OptionTooLarge(len)) => {
                // Skip the payload and say so; the option stream stays in step. EXPORT_NAME
                // has no error reply (the client would read one as the export's size): close.
                let option = u32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
                if option == proto::OPT_EXPORT_NAME {
                    return Err(proto::ProtocolError::OptionTooLarge(len).into());
                }
                skip(&mut *stream, u64::from(len), &limit)?;
                let why = if limit.stopping()? {
                    proto::REP_ERR_SHUTDOWN
                } else {
                    proto::REP_ERR_TOO_BIG
                };
                proto::option_reply(option, why, &[], &mut out);
                write_full(&mut *stream, &out, &limit)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut payload = vec![0u8; h.len as usize];
        read_full(&mut *stream, &mut payload, &limit)?;
        // The server stops: every option but ABORT is refused, the one in flight included,
        // and the client is expected to answer with ABORT (the spec's soft disconnect).
        if limit.stopping()? && h.option != proto::OPT_ABORT {
            if h.option == proto::OPT_EXPORT_NAME {
                // No error reply exists for this option: close.
                return Err(ConnectionError::Stopping);
            }
            proto::option_reply(h.option, proto::REP_ERR_SHUTDOWN, &[], &mut out);
            write_full(&mut *stream, &out, &limit)?;
            continue;
        }
        if exports.tls.is_some()
            && !tls_active
            && h.option != proto::OPT_STARTTLS
            && h.option != proto::OPT_ABORT
        {
            if h.option == proto::OPT_EXPORT_NAME {
                // No error reply exists for this option: close.
                return Err(ConnectionError::TlsRequired);
            }
            proto::option_reply(h.option, proto::REP_ERR_TLS_REQD, &[], &mut out);
            write_full(&mut *stream, &out, &limit)?;
            continue;
        }
        match h.option {
            proto::OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&payload).into_owned();
                let Some(claim) = exports.claim(&name) else {
                    // The protocol has no error reply for this option: close.
                    return Err(ConnectionError::UnknownExport(name));
                };
                let size = claim.export.array.size_bytes();
                let tflags = transmission_flags(claim.export.read_only);
                proto::export_name_reply(size, tflags, no_zeroes, &mut out);
                write_full(&mut *stream, &out, &limit)?;
                return Ok(Some((stream, claim)));
            }
            proto::OPT_ABORT => {
                proto::option_reply(h.option, proto::REP_ACK, &[], &mut out);
                let _ = write_full(&mut *stream, &out, &limit);
                return Ok(None);
            }
            proto::OPT_LIST => {
                if payload.is_empty() {
                    for name in exports.names() {
                        let mut entry = Vec::with_capacity(4 + name.len());
                        entry.extend_from_slice(&(name.len() as u32).to_be_bytes());
                        entry.extend_from_slice(name.as_bytes());
                        proto::option_reply(h.option, proto::REP_SERVER, &entry, &mut out);
                    }
                    proto::option_reply(h.option, proto::REP_ACK, &[], &mut out);
                } else {
                    proto::option_reply(h.option, proto::REP_ERR_INVALID, &[], &mut out);
                }
            }
            proto::OPT_INFO | proto::OPT_GO => match proto::decode_info_request(&payload) {
                None => proto::option_reply(h.option, proto::REP_ERR_INVALID, &[], &mut out),
                Some(req) => match option_export(exports, h.option, &req.name) {
                    None => proto::option_reply(h.option, proto::REP_ERR_UNKNOWN, &[], &mut out),
                    Some((export, claim)) => {
                        let size = export.size_bytes;
                        let tflags = transmission_flags(export.read_only);
                        let preferred = export.preferred_block;
                        let info = proto::info_export(size, tflags);
                        proto::option_reply(h.option, proto::REP_INFO, &info, &mut out);
                        let block =
                            proto::info_block_size(BLOCK_BYTES_MIN, preferred, REQUEST_BYTES_MAX);
                        proto::option_reply(h.option, proto::REP_INFO, &block, &mut out);
                        if req.requests.contains(&proto::INFO_NAME) {
                            let mut name = proto::INFO_NAME.to_be_bytes().to_vec();
                            name.extend_from_slice(export.name.as_bytes());
                            proto::option_reply(h.option, proto::REP_INFO, &name, &mut out);
                        }
                        proto::option_reply(h.option, proto::REP_ACK, &[], &mut out);
                        if let Some(claim) = claim {
                            write_full(&mut *stream, &out, &limit)?;
                            return Ok(Some((stream, claim)));
                        }
                    }
                },
            },
            proto::OPT_STARTTLS => match &exports.tls {
                None => {
                    let why = b"TLS is not configured on this server";
                    proto::option_reply(h.option, proto::REP_ERR_POLICY, why, &mut out);
                }
                Some(_) if tls_active || !payload.is_empty() => {
                    proto::option_reply(h.option, proto::REP_ERR_INVALID, &[], &mut out);
                }
                Some(setup) => {
                    proto::option_reply(h.option, proto::REP_ACK, &[], &mut out);
                    write_full(&mut *stream, &out, &limit)?;
                    stream = start_tls(stream, setup, &limit)?;
                    tls_active = true;
                    continue;
                }
            },
            _ => proto::option_reply(h.option, proto::REP_ERR_UNSUP, &[], &mut out),
        }
        write_full(&mut *stream, &out, &limit)?;
    }
}

/// The export an `OPT_INFO` or `OPT_GO` asks for: described, and for `OPT_GO` claimed (the
/// connection counts on it from now on).
fn option_export(
    exports: &Catalog,
    option: u32,
    asked: &str,
) -> Option<(Described, Option<Claim>)> {
    if option == proto::OPT_GO {
        let claim = exports.claim(asked)?;
        Some((Described::of(&claim.export), Some(claim)))
    } else {
        exports.describe(asked).map(|d| (d, None))
    }
}

/// The TLS handshake after STARTTLS, under the negotiation's deadline.
fn start_tls(
    plain: Box<dyn Stream>,
    setup: &crate::tls::TlsSetup,
    limit: &Limit,
) -> Result<Box<dyn Stream>, ConnectionError> {
    let mut tls = crate::tls::TlsStream::new(plain, setup)?;
    loop {
        match tls.advance_handshake() {
            Ok(()) => return Ok(Box::new(tls)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let events = if tls.output_waiting() { libc::POLLOUT } else { libc::POLLIN };
                wait_until(&tls, events, limit)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A request in flight.
#[derive(Debug)]
struct Slot {
    live: bool,
    cookie: u64,
    /// Read data, assembled as the pieces arrive (capacity kept between requests).
    data: Vec<u8>,
    reads: bool,
    /// A trim or write-zeroes larger than `RANGE_STEP_BYTES` goes to the engine one step at
    /// a time: what is left after the step in flight.
    rest: Option<RangeRest>,
    /// The first error of any step (0: none).
    error: u32,
    /// For reads: the part of `data` the client asked for (offset, length); an unaligned
    /// read reads the whole blocks around it.
    reply: (usize, usize),
}

/// What remains of a stepped trim or write-zeroes.
#[derive(Clone, Copy, Debug)]
struct RangeRest {
    zeroes: bool,
    /// Within one stripe, FUA goes to the engine with the request: the stripe flushes the
    /// members it zeroed once done (one flush each). Across stripes the engine would flush
    /// every member once per stripe, unmerged (a 1 GiB FUA trim of RAID 6 on files: 1.1 s
    /// against 0.3 s), so the steps go without FUA and `flush_after` ends the range with one
    /// array flush before the reply.
    durability: Durability,
    flush_after: bool,
    offset: u64,
    end: u64,
}

impl RangeRest {
    /// The next step's request, and what remains after it.
    fn step(self) -> (ArrayOp, Option<RangeRest>) {
        if self.offset == self.end {
            assert!(self.flush_after, "a range step past the end");
            return (ArrayOp::Flush, None);
        }
        let len_bytes = (self.end - self.offset).min(RANGE_STEP_BYTES);
        let offset = ArrayOffset(self.offset);
        let durability = self.durability;
        let op = if self.zeroes {
            ArrayOp::WriteZeroes { offset, len_bytes, durability }
        } else {
            ArrayOp::Discard { offset, len_bytes, durability }
        };
        let next = self.offset + len_bytes;
        let more = next < self.end || self.flush_after;
        (op, more.then_some(RangeRest { offset: next, ..self }))
    }
}

struct Transmission {
    stream: Box<dyn Stream>,
    session: Session,
    size_bytes: u64,
    /// Data bytes of one stripe: a FUA trim or write-zeroes within one stripe carries its FUA
    /// into the engine, a larger one ends with one array flush (see `RangeRest`).
    stripe_data_bytes: u64,
    read_only: bool,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// The capacity of every slot's read buffer, summed (see `READ_BUFFERS_BYTES_MAX`).
    slot_bytes: usize,
    /// Bytes received, `rbuf[rstart..rend]` not yet consumed.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// Payload bytes of a refused write still to throw away.
    skip_bytes: u64,
    /// The refusal of that write (cookie, error), sent once its payload is all thrown away:
    /// clients (libnbd) count a request in flight only once they have sent all of it, and
    /// take a reply that comes earlier for one to a request they never made.
    skip_reply: Option<(u64, u32)>,
    /// The last write was large: read little into `rbuf` (see `RBUF_READ_AFTER_LARGE_BYTES`).
    large_writes: bool,
    /// Replies not yet written, in order: a header, and for a read the slot whose data
    /// follows it (the slot is freed once that is written). Written with `writev`, straight
    /// from the slots: read data is not copied again on its way out.
    outq: std::collections::VecDeque<Out>,
    /// Bytes of the front reply already written.
    out_pos: usize,
    /// Bytes queued in `outq` and not yet written.
    out_bytes: usize,
    /// The client said goodbye or the server stops: take no more requests.
    closing: bool,
    /// The socket is dead: replies are dropped.
    dead: bool,
    /// The request at the head of `rbuf` waits for a slot or for session buffers: reading
    /// more would only fill the buffer (and `poll` would spin on a readable socket).
    stalled: bool,
    /// Slots whose next range step waits to be submitted (at most one entry per slot).
    stepping: Vec<usize>,
    /// Slots whose engine request finished in this poll (scratch, at most one per slot).
    done_scratch: Vec<usize>,
    /// Run as a reactor's job: nothing may block, so a large write whose payload has not
    /// all arrived is staged in the session and filled as the rest comes (`staging`).
    in_reactor: bool,
    /// (In a reactor) the slot of the write whose payload is being read from the socket
    /// into the session's buffers (`Session::stage_write`); nothing else is read meanwhile.
    staging: Option<usize>,
}

impl Transmission {
    fn new(stream: Box<dyn Stream>, session: Session, array: &Array, read_only: bool) -> Self {
        Self {
            stream,
            session,
            size_bytes: array.size_bytes(),
            stripe_data_bytes: array.geometry().stripe_data_bytes(),
            read_only,
            slots: (0..CONNECTION_REQUESTS_MAX)
                .map(|_| Slot {
                    live: false,
                    cookie: 0,
                    data: Vec::new(),
                    reads: false,
                    rest: None,
                    error: 0,
                    reply: (0, 0),
                })
                .collect(),
            free: (0..CONNECTION_REQUESTS_MAX).rev().collect(),
            slot_bytes: 0,
            rbuf: vec![0u8; RBUF_BYTES],
            rstart: 0,
            rend: 0,
            skip_bytes: 0,
            skip_reply: None,
            large_writes: false,
            outq: std::collections::VecDeque::with_capacity(2 * CONNECTION_REQUESTS_MAX),
            out_pos: 0,
            out_bytes: 0,
            closing: false,
            dead: false,
            stalled: false,
            stepping: Vec::with_capacity(CONNECTION_REQUESTS_MAX),
            done_scratch: Vec::with_capacity(CONNECTION_REQUESTS_MAX),
            in_reactor: false,
            staging: None,
        }
    }

    /// Nothing in flight, half received or waiting to be sent: only the client can make
    /// anything happen.
    fn is_quiet(&self) -> bool {
        self.in_flight() == 0
            && self.rstart == self.rend
            && self.skip_bytes == 0
            && self.backlog() == 0
            && !self.stream.output_waiting()
            && !self.closing
    }

    fn in_flight(&self) -> usize {
        CONNECTION_REQUESTS_MAX - self.free.len()
    }

    fn backlog(&self) -> usize {
        self.out_bytes
    }

    /// Serve on this thread until the connection ends, sleeping in `poll(2)` when idle.
    fn run(mut self, stop: &AtomicBool) -> Result<(), ConnectionError> {
        let mut ending = Ending::default();
        let mut idle_since: Option<Instant> = None;
        loop {
            let progress = match self.step(stop, &mut ending) {
                Step::Done(result) => return result,
                Step::Went { progress } => progress,
            };
            match (progress, idle_since) {
                (true, _) => idle_since = None,
                (false, None) => idle_since = Some(Instant::now()),
                // Requests in flight finish within microseconds on fast members: poll a
                // little (yielding the core) before paying for a sleep and a wake-up.
                (false, Some(since))
                    if (self.in_flight() > 0 || self.rend > self.rstart)
                        && since.elapsed() < SPIN_BEFORE_SLEEP =>
                {
                    std::thread::yield_now();
                }
                (false, Some(_)) => {
                    self.sleep();
                    idle_since = None;
                }
            }
        }
    }

    /// One pass: take what the socket has, submit, collect, answer. Never blocks (but see
    /// the direct payload path in `process`, which blocks only on a thread of its own).
    fn step(&mut self, stop: &AtomicBool, ending: &mut Ending) -> Step {
        if stop.load(Ordering::Relaxed) && ending.stopping_since.is_none() {
            ending.stopping_since = Some(Instant::now());
            // Requests already received are answered, not dropped; after a client's
            // NBD_CMD_DISC there are none (nothing it sent after is a request).
            if !self.closing {
                self.refuse_received(proto::ESHUTDOWN);
            }
            self.closing = true;
        }
        if let Some(since) = ending.stopping_since
            && since.elapsed() > STOP_DRAIN_TIMEOUT
        {
            // A client that does not read its replies must not hold the shutdown.
            self.dead = true;
        }
        let mut progress = false;
        let can_take = !self.closing
            && !self.dead
            && !self.stalled
            && self.staging.is_none()
            && self.backlog() < REPLY_BACKLOG_BYTES_MAX;
        if can_take {
            match self.receive() {
                Ok(p) => progress |= p,
                Err(e) => {
                    self.closing = true;
                    self.dead = true;
                    ending.protocol_error.get_or_insert(ConnectionError::Io(e));
                }
            }
        }
        if !self.closing {
            match self.process(stop) {
                Ok(p) => progress |= p,
                Err(e) => {
                    // Bytes that can never be a request: nothing more can be parsed.
                    self.closing = true;
                    self.rstart = self.rend;
                    ending.protocol_error.get_or_insert(e);
                }
            }
        }
        if (self.closing || self.dead) && self.staging.is_some() {
            // A payload the socket already holds whole still makes its write (and its
            // answer, as on a thread, which reads a payload before it looks at the stop);
            // the rest of one that has not arrived is no longer read: its write is given up.
            if !self.dead
                && let Err(e) = self.fill_staged()
            {
                ending.protocol_error.get_or_insert(e);
            }
            self.abandon_staged();
        }
        progress |= self.complete() > 0;
        progress |= self.advance_ranges();
        progress |= self.send_replies();
        let all_sent = self.backlog() == 0 && !self.stream.output_waiting();
        if self.closing && self.in_flight() == 0 && (all_sent || self.dead) {
            if !self.dead {
                self.stream.close();
            }
            return Step::Done(ending.protocol_error.take().map_or(Ok(()), Err));
        }
        Step::Went { progress }
    }

    /// Answer every whole request already received with `errno`, without submitting it
    /// (the server is stopping).
    fn refuse_received(&mut self, errno: u32) {
        if self.skip_bytes > 0 {
            // The bytes received are a refused write's payload, not requests; its refusal
            // waits for the rest of it, which a stopping server no longer reads.
            return;
        }
        while let Ok(Decoded::Item(r, _)) =
            proto::decode_request(&self.rbuf[self.rstart..self.rend])
        {
            let need = proto::REQUEST_BYTES + r.payload_bytes();
            if self.rend - self.rstart < need {
                break;
            }
            self.rstart += need;
            if r.kind == proto::CMD_DISC {
                break;
            }
            self.reply_now(r.cookie, errno);
        }
    }

    /// Read what the socket has. True if bytes arrived.
    fn receive(&mut self) -> io::Result<bool> {
        if self.rstart == self.rend {
            self.rstart = 0;
            self.rend = 0;
            if self.rbuf.len() > RBUF_BYTES {
                // Grown for one large write: give the memory back.
                self.rbuf.truncate(RBUF_BYTES);
                self.rbuf.shrink_to_fit();
            }
        }
        if self.rend == self.rbuf.len() {
            if self.rstart > 0 {
                self.rbuf.copy_within(self.rstart..self.rend, 0);
                self.rend -= self.rstart;
                self.rstart = 0;
            } else {
                // A request larger than the buffer (bounded by `process`): wait for it.
                return Ok(false);
            }
        }
        let end = if self.large_writes {
            (self.rend + RBUF_READ_AFTER_LARGE_BYTES).min(self.rbuf.len())
        } else {
            self.rbuf.len()
        };
        match self.stream.read(&mut self.rbuf[self.rend..end]) {
            Ok(0) => {
                // The client went away (without NBD_CMD_DISC): finish what was submitted.
                self.closing = true;
                Ok(true)
            }
            Ok(n) => {
                self.rend += n;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Parse and submit complete requests. True if any was consumed.
    fn process(&mut self, stop: &AtomicBool) -> Result<bool, ConnectionError> {
        let mut progress = false;
        self.stalled = false;
        loop {
            if self.staging.is_some() {
                progress |= self.fill_staged()?;
                if self.staging.is_some() {
                    return Ok(progress);
                }
            }
            if self.skip_bytes > 0 {
                let n = (self.rend - self.rstart)
                    .min(usize::try_from(self.skip_bytes).unwrap_or(usize::MAX));
                if n == 0 {
                    return Ok(progress);
                }
                self.rstart += n;
                self.skip_bytes -= n as u64;
                if self.skip_bytes == 0
                    && let Some((cookie, errno)) = self.skip_reply.take()
                {
                    self.reply_now(cookie, errno);
                }
                progress = true;
                continue;
            }
            let request = match proto::decode_request(&self.rbuf[self.rstart..self.rend])? {
                Decoded::Incomplete => return Ok(progress),
                Decoded::Item(r, _) => r,
            };
            let payload = request.payload_bytes();
            if request.kind == proto::CMD_WRITE && request.len > REQUEST_BYTES_MAX {
                // Too large to buffer: throw its payload away as it arrives, then refuse it
                // (EINVAL: the spec keeps EOVERFLOW for reads with DF; EPERM on a read-only
                // export, as every other write there).
                self.rstart += proto::REQUEST_BYTES;
                let error = if self.read_only { proto::EPERM } else { proto::EINVAL };
                self.refuse_after_payload(request.cookie, error, request.len.into());
                progress = true;
                continue;
            }
            let need = proto::REQUEST_BYTES + payload;
            if request.kind == proto::CMD_WRITE {
                self.large_writes = payload >= DIRECT_PAYLOAD_BYTES_MIN;
            }
            let have = self.rend - self.rstart;
            // A large write that has not all arrived: the rest of its payload is read straight
            // into the session's buffers.
            let direct = have < need && self.large_writes;
            if have < need && !direct {
                if self.rbuf.len() - self.rstart < need {
                    // Make room for the whole request (at most REQUEST_BYTES_MAX + header).
                    self.rbuf.copy_within(self.rstart..self.rend, 0);
                    self.rend -= self.rstart;
                    self.rstart = 0;
                    if self.rbuf.len() < need {
                        self.rbuf.resize(need, 0);
                    }
                }
                return Ok(progress);
            }
            if request.kind == proto::CMD_DISC {
                // The client sends nothing after a disconnect (the spec's MUST NOT): what
                // follows it is no request, and is dropped unread.
                self.rstart = self.rend;
                self.closing = true;
                return Ok(true);
            }
            let Some(slot) = self.free.pop() else {
                self.stalled = true;
                return Ok(progress);
            };
            let start = self.rstart + proto::REQUEST_BYTES;
            match self.submit(slot, &request, start, payload, direct.then_some(stop)) {
                Submitted::Yes => {}
                Submitted::Refused(errno) => {
                    self.free.push(slot);
                    let rest = if direct { (need - have) as u64 } else { 0 };
                    self.refuse_after_payload(request.cookie, errno, rest);
                }
                Submitted::Later => {
                    self.free.push(slot);
                    self.stalled = true;
                    return Ok(progress);
                }
                Submitted::Broken(e) => {
                    self.free.push(slot);
                    return Err(e);
                }
            }
            // A direct write took every byte received (the rest came from the socket, or is
            // skipped).
            self.rstart = if direct { self.rend } else { self.rstart + need };
            progress = true;
        }
    }

    /// Read more of the staged write's payload from the socket, and send the write once it
    /// is whole. True if bytes came. A socket that fails or closes mid-payload ends the
    /// connection; the write is given up unsent and unanswered (the client never finished
    /// sending it).
    fn fill_staged(&mut self) -> Result<bool, ConnectionError> {
        let slot = self.staging.expect("a write being staged");
        let stream = &mut self.stream;
        let mut came = false;
        let full = self.session.fill_staged(&mut |targets| {
            loop {
                match stream.read_vectored(targets) {
                    Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                    Ok(n) => {
                        came = true;
                        return Ok(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        });
        match full {
            Ok(false) => Ok(came),
            Ok(true) => {
                self.staging = None;
                if let Err(e) = self.session.submit_staged() {
                    // Only a stopped array refuses a reserved request; the payload is all
                    // read, so the stream is in step and the write can be answered.
                    assert_eq!(e, SubmitError::Stopped, "a staged write refused: {e}");
                    self.finish(slot, proto::ESHUTDOWN);
                }
                Ok(true)
            }
            Err(e) => {
                self.abandon_staged();
                Err(ConnectionError::Io(e))
            }
        }
    }

    /// Give up a write whose payload will not come (the connection ends).
    fn abandon_staged(&mut self) {
        if let Some(slot) = self.staging.take() {
            self.session.cancel_staged();
            self.slots[slot].live = false;
            self.release(slot);
        }
    }

    fn check(&self, r: &proto::Request, modifies: bool) -> Result<(), u32> {
        if modifies && self.read_only {
            return Err(proto::EPERM);
        }
        let end = r.offset.checked_add(u64::from(r.len));
        match end {
            Some(end) if end <= self.size_bytes => {}
            _ => {
                // The spec names ENOSPC for writes and write-zeroes past the end.
                let write = matches!(r.kind, proto::CMD_WRITE | proto::CMD_WRITE_ZEROES);
                return Err(if write { proto::ENOSPC } else { proto::EINVAL });
            }
        }
        let block = u64::from(BLOCK_BYTES_MIN);
        if !r.offset.is_multiple_of(block) || !u64::from(r.len).is_multiple_of(block) {
            return Err(proto::EINVAL);
        }
        if matches!(r.kind, proto::CMD_READ | proto::CMD_WRITE) && r.len > REQUEST_BYTES_MAX {
            return Err(proto::EINVAL);
        }
        Ok(())
    }

    /// Submit request `r` in `slot`; a write's payload starts at `rbuf[start]` and is
    /// `payload` bytes. With `from_socket` (the stop flag), the payload has not all arrived:
    /// what `rbuf` holds is taken from there and the rest read from the socket into the
    /// session's buffers.
    fn submit(
        &mut self,
        slot: usize,
        r: &proto::Request,
        start: usize,
        payload: usize,
        from_socket: Option<&AtomicBool>,
    ) -> Submitted {
        // FUA is valid on every command; NO_HOLE only on write-zeroes (the spec asks for
        // EINVAL on a flag not documented for the command).
        let allowed = match r.kind {
            proto::CMD_WRITE_ZEROES => proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE,
            _ => proto::CMD_FLAG_FUA,
        };
        if r.flags & !allowed != 0 {
            return Submitted::Refused(proto::EINVAL);
        }
        let durability =
            if r.flags & proto::CMD_FLAG_FUA != 0 { Durability::Fua } else { Durability::Cached };
        // An unaligned read is served by reading the whole blocks around it (reads have no
        // side effects; unaligned writes would need a read-modify-write of blocks other
        // requests may be writing, so they are refused).
        let mut read_skip = 0usize;
        let reply_len = r.len as usize;
        let widened;
        let r = match r.offset.checked_add(u64::from(r.len)) {
            Some(end)
                if r.kind == proto::CMD_READ
                    && end <= self.size_bytes
                    && r.len <= REQUEST_BYTES_MAX
                    && !(r.offset | u64::from(r.len))
                        .is_multiple_of(u64::from(BLOCK_BYTES_MIN)) =>
            {
                let block = u64::from(BLOCK_BYTES_MIN);
                let start = r.offset / block * block;
                let end = end.next_multiple_of(block);
                read_skip = (r.offset - start) as usize;
                widened = proto::Request { offset: start, len: (end - start) as u32, ..*r };
                &widened
            }
            _ => r,
        };
        let offset = ArrayOffset(r.offset);
        let len_bytes = u64::from(r.len);
        let (op, modifies) = match r.kind {
            proto::CMD_READ => (Some(ArrayOp::Read { offset, len_bytes }), false),
            proto::CMD_WRITE => (Some(ArrayOp::Write { offset, len_bytes, durability }), true),
            proto::CMD_FLUSH => (Some(ArrayOp::Flush), false),
            // Sent in steps from the (shrunk) range below: `RangeRest`.
            proto::CMD_TRIM | proto::CMD_WRITE_ZEROES => (None, true),
            _ => return Submitted::Refused(proto::EINVAL),
        };
        // Trim is advisory: an unaligned one (nbdfuse passes FUSE's through) is shrunk to
        // the whole blocks inside it rather than refused.
        let trimmed;
        let end = r.offset.checked_add(u64::from(r.len)).filter(|&end| end <= self.size_bytes);
        let r = if let (proto::CMD_TRIM, false, Some(end)) = (r.kind, self.read_only, end) {
            let block = u64::from(BLOCK_BYTES_MIN);
            let start = r.offset.next_multiple_of(block).min(end);
            let len = (end - start) / block * block;
            // No whole block inside: nothing to trim, and the (aligned) start is checked.
            let start = if len == 0 { r.offset / block * block } else { start };
            trimmed = proto::Request { offset: start, len: len as u32, ..*r };
            &trimmed
        } else {
            r
        };
        if r.kind != proto::CMD_FLUSH {
            if let Err(errno) = self.check(r, modifies) {
                return Submitted::Refused(errno);
            }
            if r.len == 0 {
                return Submitted::Refused(0);
            }
        }
        let (op, rest) = match r.kind {
            proto::CMD_TRIM | proto::CMD_WRITE_ZEROES => {
                let end = r.offset + u64::from(r.len);
                let zeroes = r.kind == proto::CMD_WRITE_ZEROES;
                let stripe = self.stripe_data_bytes;
                // The stripes the request changes: a write-zeroes writes every stripe it
                // touches; a trim zeroes only the whole stripes inside it (found by review:
                // a trim across a stripe boundary changes nothing, yet cost an array flush).
                let stripes_changed = if zeroes {
                    (end - 1) / stripe - r.offset / stripe + 1
                } else {
                    (end / stripe).saturating_sub(r.offset.div_ceil(stripe))
                };
                let fua = durability == Durability::Fua;
                RangeRest {
                    zeroes,
                    durability: if stripes_changed == 1 { durability } else { Durability::Cached },
                    flush_after: fua && stripes_changed > 1,
                    offset: r.offset,
                    end,
                }
                .step()
            }
            _ => (op.expect("a read, write or flush"), None),
        };
        if r.kind == proto::CMD_READ && !self.room_for_read(slot, r.len as usize) {
            return Submitted::Later;
        }
        let direct = from_socket.filter(|_| r.kind == proto::CMD_WRITE);
        let mut fill_error = None;
        let staged = direct.is_some() && self.in_reactor;
        let submitted = if staged {
            // A job cannot wait for the payload: stage the write, put in what has arrived,
            // and read the rest as it comes (`fill_staged`).
            self.session.stage_write(op, slot as u64).map(|()| {
                let mut received = &self.rbuf[start..self.rend];
                let full = self.session.fill_staged(&mut |targets| {
                    let mut n = 0;
                    for target in targets.iter_mut() {
                        let take = target.len().min(received.len());
                        target[..take].copy_from_slice(&received[..take]);
                        received = &received[take..];
                        n += take;
                    }
                    Ok(n)
                });
                assert!(
                    matches!(full, Ok(false)) && received.is_empty(),
                    "a direct write's payload is larger than what has arrived"
                );
                self.staging = Some(slot);
            })
        } else if let Some(stop) = direct {
            let received = &self.rbuf[start..self.rend];
            let stream = &mut self.stream;
            // A stopping server gives the payload up at once.
            let limit = Limit::new(stop, Instant::now() + PAYLOAD_TIMEOUT, None);
            let error = &mut fill_error;
            let mut consumed = 0usize;
            let mut fill = |at: u64, piece: &mut [u8]| -> io::Result<()> {
                let at = usize::try_from(at).expect("fits");
                // The payload is one stream: pieces must come in order, without gaps.
                assert_eq!(at, consumed, "write pieces filled out of order");
                consumed += piece.len();
                let from_buf = received.len().saturating_sub(at).min(piece.len());
                if from_buf > 0 {
                    piece[..from_buf].copy_from_slice(&received[at..at + from_buf]);
                }
                read_full(&mut **stream, &mut piece[from_buf..], &limit).map_err(|e| {
                    let e = match e {
                        ConnectionError::HandshakeTimeout(_) => {
                            ConnectionError::PayloadTimeout(PAYLOAD_TIMEOUT)
                        }
                        other => other,
                    };
                    let message = e.to_string();
                    *error = Some(e);
                    io::Error::other(message)
                })
            };
            self.session.submit_filled(op, slot as u64, &mut fill)
        } else {
            let data = (r.kind == proto::CMD_WRITE).then(|| &self.rbuf[start..start + payload]);
            self.session.submit(op, data, slot as u64)
        };
        match submitted {
            Ok(()) => {
                let s = &mut self.slots[slot];
                s.live = true;
                s.cookie = r.cookie;
                s.reads = r.kind == proto::CMD_READ;
                s.rest = rest;
                s.error = 0;
                if s.reads {
                    let before = s.data.capacity();
                    s.data.clear();
                    s.data.resize(r.len as usize, 0);
                    s.reply = (read_skip, reply_len);
                    self.slot_bytes = self.slot_bytes - before + s.data.capacity();
                }
                Submitted::Yes
            }
            Err(SubmitError::Full) => Submitted::Later,
            // A payload read from the socket is gone from the stream: refusing it would skip
            // bytes of the next requests. The array is stopping; the connection ends.
            Err(SubmitError::Stopped) if direct.is_some() => {
                Submitted::Broken(ConnectionError::Stopping)
            }
            Err(SubmitError::Stopped) => Submitted::Refused(proto::ESHUTDOWN),
            // The payload did not come (the client went away or stalled): the stream is
            // out of step, the connection ends.
            Err(SubmitError::Fill(message)) => Submitted::Broken(
                fill_error.unwrap_or_else(|| ConnectionError::Io(io::Error::other(message))),
            ),
            Err(
                SubmitError::Invalid(_)
                | SubmitError::TooLarge { .. }
                | SubmitError::NeverFits { .. },
            ) => Submitted::Refused(proto::EINVAL),
        }
    }

    /// Submit the next step of stepped ranges whose previous step finished. True if any
    /// went out.
    fn advance_ranges(&mut self) -> bool {
        let mut progress = false;
        let mut index = 0;
        while index < self.stepping.len() {
            let slot = self.stepping[index];
            let rest = self.slots[slot].rest.expect("a stepping slot has a rest");
            let (op, next) = rest.step();
            match self.session.submit(op, None, slot as u64) {
                Ok(()) => {
                    self.slots[slot].rest = next;
                    self.stepping.swap_remove(index);
                    progress = true;
                }
                Err(SubmitError::Full) => index += 1,
                Err(e) => {
                    let errno = match e {
                        SubmitError::Stopped => proto::ESHUTDOWN,
                        _ => proto::EINVAL,
                    };
                    self.stepping.swap_remove(index);
                    self.finish(slot, errno);
                    progress = true;
                }
            }
        }
        progress
    }

    /// Answer the request in `slot` (errno 0: success). The slot is freed now, or for a
    /// read once its data is written.
    fn finish(&mut self, slot: usize, errno: u32) {
        let s = &mut self.slots[slot];
        s.live = false;
        s.rest = None;
        let header = proto::simple_reply(errno, s.cookie);
        if !self.dead && errno == 0 && s.reads {
            self.out_bytes += header.len() + s.reply.1;
            self.outq.push_back(Out { header, data_slot: Some(slot) });
            return;
        }
        if !self.dead {
            self.out_bytes += header.len();
            self.outq.push_back(Out { header, data_slot: None });
        }
        self.release(slot);
    }

    fn release(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if s.data.capacity() > KEEP_BUFFER_BYTES {
            self.slot_bytes -= s.data.capacity();
            s.data = Vec::new();
        }
        self.free.push(slot);
    }

    /// Whether a read of `len` bytes in `slot` keeps the connection's read buffers within
    /// `READ_BUFFERS_BYTES_MAX` (the buffers free slots keep are given back first). A read
    /// always may when no other slot holds a buffer, so the largest request is served.
    fn room_for_read(&mut self, slot: usize, len: usize) -> bool {
        let grow = len.saturating_sub(self.slots[slot].data.capacity());
        if self.slot_bytes + grow <= READ_BUFFERS_BYTES_MAX {
            return true;
        }
        for &free in &self.free {
            let s = &mut self.slots[free];
            self.slot_bytes -= s.data.capacity();
            s.data = Vec::new();
        }
        self.slot_bytes + grow <= READ_BUFFERS_BYTES_MAX
            || self.slot_bytes == self.slots[slot].data.capacity()
    }

    /// Refuse a request whose payload still has `rest_bytes` to come: they are thrown away
    /// as they arrive, and the reply goes out after the last of them.
    fn refuse_after_payload(&mut self, cookie: u64, errno: u32, rest_bytes: u64) {
        assert_eq!(self.skip_bytes, 0, "one payload is skipped at a time");
        if rest_bytes == 0 {
            self.reply_now(cookie, errno);
        } else {
            self.skip_bytes = rest_bytes;
            self.skip_reply = Some((cookie, errno));
        }
    }

    fn reply_now(&mut self, cookie: u64, errno: u32) {
        if !self.dead {
            let header = proto::simple_reply(errno, cookie);
            self.out_bytes += header.len();
            self.outq.push_back(Out { header, data_slot: None });
        }
    }

    /// Collect finished requests into replies. Returns how many engine requests finished.
    fn complete(&mut self) -> usize {
        let slots = &mut self.slots;
        let done = &mut self.done_scratch;
        let finished = self.session.poll(false, &mut |event| match event {
            Event::Data { tag, offset_in_request, data } => {
                let s = &mut slots[tag as usize];
                let at = offset_in_request as usize;
                s.data[at..at + data.len()].copy_from_slice(data);
            }
            Event::Done { tag, result } => {
                let s = &mut slots[tag as usize];
                assert!(s.live, "a completion for connection slot {tag}, which is free");
                if let Err(e) = result
                    && s.error == 0
                {
                    s.error = errno(&e);
                }
                done.push(tag as usize);
            }
        });
        let mut done = std::mem::take(&mut self.done_scratch);
        for &slot in &done {
            let s = &self.slots[slot];
            if s.rest.is_some() && s.error == 0 {
                self.stepping.push(slot);
            } else {
                let errno = s.error;
                self.finish(slot, errno);
            }
        }
        done.clear();
        self.done_scratch = done;
        finished
    }

    /// Write pending replies. True if bytes left.
    fn send_replies(&mut self) -> bool {
        if self.dead {
            self.drop_replies();
            return false;
        }
        let mut progress = false;
        if self.stream.output_waiting() {
            match self.stream.send_waiting() {
                Ok(()) => progress = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(_) => {
                    self.dead = true;
                    self.closing = true;
                    self.drop_replies();
                    return false;
                }
            }
        }
        while !self.outq.is_empty() {
            // Gather up to IOV_MAX_USED slices: headers and read data, in order.
            let mut iov = [io::IoSlice::new(&[]); IOV_MAX_USED];
            let mut count = 0;
            let mut skip = self.out_pos;
            for out in self.outq.iter() {
                if count + 2 > IOV_MAX_USED {
                    break;
                }
                let data: &[u8] = match out.data_slot {
                    Some(slot) => {
                        let (at, len) = self.slots[slot].reply;
                        &self.slots[slot].data[at..at + len]
                    }
                    None => &[],
                };
                for part in [&out.header[..], data] {
                    if skip >= part.len() {
                        skip -= part.len();
                        continue;
                    }
                    iov[count] = io::IoSlice::new(&part[skip..]);
                    skip = 0;
                    count += 1;
                }
            }
            // writev on a socket; TLS encrypts the same slices.
            let n = match self.stream.write_vectored(&iov[..count]) {
                Ok(0) => {
                    self.dead = true;
                    self.closing = true;
                    self.drop_replies();
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // The client is gone: what it had in flight still finishes in the engine.
                    self.dead = true;
                    self.closing = true;
                    self.drop_replies();
                    break;
                }
            };
            progress = true;
            let mut written = n;
            self.out_bytes -= written;
            while written > 0 {
                let front = self.outq.front().expect("bytes written belong to queued replies");
                let len =
                    front.header.len() + front.data_slot.map_or(0, |slot| self.slots[slot].reply.1);
                let left = len - self.out_pos;
                if written < left {
                    self.out_pos += written;
                    break;
                }
                written -= left;
                self.out_pos = 0;
                let done = self.outq.pop_front().expect("front");
                if let Some(slot) = done.data_slot {
                    self.release(slot);
                }
            }
        }
        progress
    }

    fn drop_replies(&mut self) {
        while let Some(out) = self.outq.pop_front() {
            if let Some(slot) = out.data_slot {
                self.release(slot);
            }
        }
        self.out_pos = 0;
        self.out_bytes = 0;
    }

    /// What to wait for on the socket when there is nothing to do: readable while requests
    /// are taken, writable while replies wait. A socket waited on for nothing would still
    /// report POLLHUP and spin the caller, so then the descriptor is -1 (`poll` skips it).
    fn socket_events(&self) -> (RawFd, i16) {
        let want_read = !self.closing
            && !self.dead
            && (self.staging.is_some()
                || (!self.stalled
                    && !self.free.is_empty()
                    && self.backlog() < REPLY_BACKLOG_BYTES_MAX));
        let mut events = 0;
        if want_read {
            events |= libc::POLLIN | libc::POLLRDHUP;
        }
        if (self.backlog() > 0 || self.stream.output_waiting()) && !self.dead {
            events |= libc::POLLOUT;
        }
        (if events == 0 { -1 } else { self.stream.as_raw_fd() }, events)
    }

    /// Nothing to do: sleep until the socket or the session has something.
    fn sleep(&mut self) {
        if self.stream.input_waiting()
            && !self.closing
            && !self.stalled
            && self.backlog() < REPLY_BACKLOG_BYTES_MAX
        {
            return; // decrypted bytes wait in the TLS layer: no socket event would say so
        }
        if !self.session.prepare_to_sleep() {
            return;
        }
        let (socket, events) = self.socket_events();
        let notify = self.session.notify_fd().expect("a session with a bell");
        let mut fds = [
            libc::pollfd { fd: socket, events, revents: 0 },
            libc::pollfd { fd: notify, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, STOP_POLL.as_millis() as i32) };
        self.session.woke();
    }
}

/// How a connection is ending: the first protocol error, and when the server's stop was seen.
#[derive(Default)]
struct Ending {
    protocol_error: Option<ConnectionError>,
    stopping_since: Option<Instant>,
}

/// What one pass of a connection did.
enum Step {
    Went { progress: bool },
    Done(Result<(), ConnectionError>),
}

/// A reply waiting for the socket.
#[derive(Debug)]
struct Out {
    header: [u8; proto::SIMPLE_REPLY_BYTES],
    /// For a successful read: the slot holding its data (`Slot::reply` says which part).
    data_slot: Option<usize>,
}

/// Slices handed to one `writev` (the kernel allows 1024).
const IOV_MAX_USED: usize = 64;

enum Submitted {
    Yes,
    /// Answer now with this error (0: success with no data, for empty requests).
    Refused(u32),
    /// The session is full: try again after completions.
    Later,
    /// The connection cannot go on (a payload read from the socket failed).
    Broken(ConnectionError),
}

fn errno(e: &ArrayError) -> u32 {
    match e {
        ArrayError::Request(RequestError::OutOfRange | RequestError::Malformed(_)) => proto::EINVAL,
        ArrayError::Request(RequestError::ShuttingDown) | ArrayError::Stopped => proto::ESHUTDOWN,
        ArrayError::Request(RequestError::ReadOnly) => proto::EPERM,
        _ => proto::EIO,
    }
}

fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    wait_fd(fd, libc::POLLIN, timeout)
}

fn wait_fd(fd: RawFd, events: i16, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    n > 0
}

/// When a blocking read or write of the negotiation (or of a write's payload on a connection
/// thread) gives up: at its deadline, or when the server stops (a client that connects and
/// says nothing must not hold a slot or the shutdown), at once or after a grace.
struct Limit<'a> {
    stop: &'a AtomicBool,
    deadline: std::cell::Cell<Instant>,
    /// How long the step may go on once the server stops (`None`: not at all).
    grace: Option<Duration>,
    /// The stop was seen, and the deadline brought within the grace.
    stopping: std::cell::Cell<bool>,
}

impl<'a> Limit<'a> {
    fn new(stop: &'a AtomicBool, deadline: Instant, grace: Option<Duration>) -> Self {
        Limit {
            stop,
            deadline: std::cell::Cell::new(deadline),
            grace,
            stopping: std::cell::Cell::new(false),
        }
    }

    /// Whether the server is stopping (the first time it is seen, the deadline comes within
    /// the grace); an error if there is no grace.
    fn stopping(&self) -> Result<bool, ConnectionError> {
        if !self.stopping.get() && self.stop.load(Ordering::Relaxed) {
            let Some(grace) = self.grace else { return Err(ConnectionError::Stopping) };
            self.stopping.set(true);
            self.deadline.set(self.deadline.get().min(Instant::now() + grace));
        }
        Ok(self.stopping.get())
    }
}

/// Wait until `stream`'s socket has `events`, within `limit`.
fn wait_until(stream: &dyn Stream, events: i16, limit: &Limit) -> Result<(), ConnectionError> {
    loop {
        let stopping = limit.stopping()?;
        let (now, deadline) = (Instant::now(), limit.deadline.get());
        if now >= deadline && stopping {
            return Err(ConnectionError::Stopping);
        }
        if now >= deadline {
            return Err(ConnectionError::HandshakeTimeout(HANDSHAKE_TIMEOUT));
        }
        if wait_fd(stream.as_raw_fd(), events, (deadline - now).min(STOP_POLL)) {
            return Ok(());
        }
    }
}

/// Read exactly `buf.len()` bytes during negotiation.
fn read_full(
    stream: &mut dyn Stream,
    buf: &mut [u8],
    limit: &Limit,
) -> Result<(), ConnectionError> {
    let mut at = 0;
    while at < buf.len() {
        match stream.read(&mut buf[at..]) {
            // A client told the server is stopping may just hang up.
            Ok(0) if limit.stopping.get() => return Err(ConnectionError::Stopping),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_until(stream, libc::POLLIN, limit)?
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Write all of `bytes` during negotiation (and push TLS records out).
fn write_full(
    stream: &mut dyn Stream,
    mut bytes: &[u8],
    limit: &Limit,
) -> Result<(), ConnectionError> {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_until(stream, libc::POLLOUT, limit)?
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    while stream.output_waiting() {
        match stream.send_waiting() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_until(stream, libc::POLLOUT, limit)?
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Read and drop `len` bytes during negotiation.
fn skip(stream: &mut dyn Stream, mut len: u64, limit: &Limit) -> Result<(), ConnectionError> {
    let mut sink = [0u8; 4096];
    while len > 0 {
        let n = len.min(sink.len() as u64) as usize;
        read_full(stream, &mut sink[..n], limit)?;
        len -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(fd: RawFd, level: i32, name: i32) -> i32 {
        let mut value = 0i32;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: `fd` is an open socket; `value` and `len` are valid for writes of their
        // sizes for the duration of the call.
        let rc =
            unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut i32).cast(), &mut len) };
        assert_eq!(rc, 0, "getsockopt: {}", io::Error::last_os_error());
        value
    }

    /// A TCP peer that vanishes must not hold its connection slot for good.
    #[test]
    fn accepted_tcp_connections_have_keepalive() {
        let listener = Listener::Tcp(TcpListener::bind("127.0.0.1:0").unwrap());
        let Listener::Tcp(l) = &listener else { unreachable!() };
        let _client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let stream = listener.accept().unwrap();
        let fd = stream.as_raw_fd();
        assert_eq!(option(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), TCP_KEEPALIVE_IDLE_S);
        assert_eq!(option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL), TCP_KEEPALIVE_INTERVAL_S);
        assert_eq!(option(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT), TCP_KEEPALIVE_PROBES);
        assert_eq!(option(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), TCP_USER_TIMEOUT_MS);
    }
}
