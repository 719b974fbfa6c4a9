//! flashraid's NBD frontend: arrays served to the kernel's nbd-client, qemu, libnbd tools
//! and fio over the Network Block Device protocol.
//!
//! Owns: [`proto`], the wire format (pure: no IO, fuzzable), and [`server`], the sockets,
//! the handshake and the per-connection event loops (the edge).

pub mod proto;
pub mod server;
pub mod signals;
pub mod tls;

pub use server::{
    ConnectionError, Export, ExportConfig, Listener, OfferError, ServedExports, Server,
    WithdrawError, Withdrawal, serve_connection,
};
