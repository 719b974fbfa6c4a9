//! TLS for NBD (the protocol's STARTTLS): x509 certificates, optionally client certificates
//! checked against a CA, with rustls over the connection's non-blocking socket.
//!
//! Owns: loading the server's certificate, key and client CA from PEM files into a rustls
//! configuration, and [`TlsStream`], which speaks TLS over a socket while looking to the
//! connection loop like the plain socket it replaces (non-blocking reads and writes,
//! `WouldBlock` when the socket is not ready, plus the two facts `poll(2)` cannot see: that
//! decrypted bytes wait in the TLS layer, and that encrypted bytes wait to be sent).
//!
//! Limits: encrypted output buffered per connection at most `TLS_SEND_BUFFER_BYTES` (beyond
//! it writes report `WouldBlock` until the socket drains).

use crate::server::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;

/// Encrypted bytes a connection may hold before its writes block.
pub const TLS_SEND_BUFFER_BYTES: usize = 4 << 20;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    File { path: String, why: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The server's TLS settings.
#[derive(Clone, Debug)]
pub struct TlsSetup {
    pub config: Arc<rustls::ServerConfig>,
    /// Whether clients must present a certificate signed by the client CA.
    pub client_certificates: bool,
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.display().to_string(), why: why.to_string() }
}

/// Load a server certificate chain and key (PEM), and optionally a CA (PEM) whose signed
/// client certificates are then required.
pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<TlsSetup, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_error(cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert, e))?;
    if chain.is_empty() {
        return Err(file_error(cert, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| file_error(ca, e))? {
                roots.add(c.map_err(|e| file_error(ca, e))?).map_err(|e| file_error(ca, e))?;
            }
            if roots.is_empty() {
                return Err(file_error(ca, "no certificate in the file"));
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config =
        builder.with_single_cert(chain, key).map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(TlsSetup { config: Arc::new(config), client_certificates: client_ca.is_some() })
}

/// TLS over a non-blocking socket.
pub struct TlsStream {
    sock: Box<dyn Stream>,
    conn: rustls::ServerConnection,
    /// Decrypted bytes waiting in `conn`.
    plaintext_waiting: usize,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream").field("fd", &self.sock.as_raw_fd()).finish_non_exhaustive()
    }
}

impl TlsStream {
    pub fn new(sock: Box<dyn Stream>, setup: &TlsSetup) -> io::Result<TlsStream> {
        let mut conn =
            rustls::ServerConnection::new(setup.config.clone()).map_err(io::Error::other)?;
        conn.set_buffer_limit(Some(TLS_SEND_BUFFER_BYTES));
        Ok(TlsStream { sock, conn, plaintext_waiting: 0 })
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Move the TLS handshake on with what the socket has; `WouldBlock` when it must wait
    /// for the peer.
    pub fn advance_handshake(&mut self) -> io::Result<()> {
        self.send_tls()?;
        while self.conn.is_handshaking() {
            if !self.receive_tls()? {
                // The peer went away mid-handshake (a client that distrusts our
                // certificate may just close): never loop on an ended stream.
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.send_tls()?;
        }
        Ok(())
    }

    /// Read TLS records from the socket and decrypt them. Ok(false) at end of stream.
    fn receive_tls(&mut self) -> io::Result<bool> {
        match self.conn.read_tls(&mut self.sock) {
            Ok(0) => Ok(false),
            Ok(_) => {
                let state = self.conn.process_new_packets().map_err(|e| {
                    // Tell the peer why before giving up (best effort).
                    let _ = self.conn.write_tls(&mut self.sock);
                    io::Error::new(io::ErrorKind::InvalidData, e)
                })?;
                self.plaintext_waiting = state.plaintext_bytes_to_read();
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// Send encrypted bytes waiting in the TLS layer, as far as the socket takes them.
    fn send_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn after_write(&mut self, accepted: usize) -> io::Result<usize> {
        match self.send_tls() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if accepted == 0 {
            // The send buffer is full: the socket must drain first.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(accepted)
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.plaintext_waiting > 0 {
                let n = self.conn.reader().read(buf)?;
                self.plaintext_waiting = self.plaintext_waiting.saturating_sub(n);
                return Ok(n);
            }
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n), // 0: the peer closed the TLS session cleanly
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !self.receive_tls()? {
                return Ok(0);
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let accepted = self.conn.writer().write(buf)?;
        self.after_write(accepted)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let accepted = self.conn.writer().write_vectored(bufs)?;
        self.after_write(accepted)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_tls()
    }
}

impl AsRawFd for TlsStream {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl Stream for TlsStream {
    fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.sock.set_nonblocking(on)
    }

    fn input_waiting(&self) -> bool {
        self.plaintext_waiting > 0
    }

    fn output_waiting(&self) -> bool {
        self.conn.wants_write()
    }

    fn send_waiting(&mut self) -> io::Result<()> {
        self.send_tls()
    }

    fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.send_tls();
    }
}
