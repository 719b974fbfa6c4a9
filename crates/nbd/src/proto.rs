//! The NBD wire protocol: constants, and decoders/encoders for the fixed newstyle handshake
//! and the transmission phase (simple replies).
//!
//! Owns: byte layouts only. No IO, no clock, no threads: every function maps bytes to values
//! or values to bytes, so the decoders can be fuzzed and the session logic tested without a
//! socket. The reference is the NBD protocol document
//! (<https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md>); all integers are
//! big-endian.
//!
//! Invariants: a decoder never panics on any input; it returns `Incomplete` when it needs
//! more bytes and `Err` when the bytes can never be valid. Lengths from the wire are checked
//! against explicit maxima before anything is sized by them.
//!
//! Limits: option payloads at most `OPTION_BYTES_MAX`; export names at most
//! `EXPORT_NAME_BYTES_MAX` (the protocol's 4096).

/// "NBDMAGIC": the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of the server's option replies.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Info types (NBD_OPT_INFO / NBD_OPT_GO).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Error values of replies (the protocol fixes these numbers, whatever the platform's).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Bytes of a transmission request header.
pub const REQUEST_BYTES: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of an option header (magic, option, length).
pub const OPTION_HEADER_BYTES: usize = 16;
/// Largest option payload accepted (a GO with a 4096-byte name and every info type fits).
pub const OPTION_BYTES_MAX: u32 = 8192;
/// Largest export name (the protocol's limit).
pub const EXPORT_NAME_BYTES_MAX: usize = 4096;

/// What a decoder says about the bytes it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<T> {
    /// A whole item, and how many bytes it used.
    Item(T, usize),
    /// Not enough bytes yet.
    Incomplete,
}

/// Bytes that can never become a valid item: the connection must close.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("option payload of {0} bytes is over the limit of {OPTION_BYTES_MAX}")]
    OptionTooLarge(u32),
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The server's greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut out = [0u8; 18];
    out[..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// A client option header; its payload (`len` bytes) follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

pub fn decode_option_header(b: &[u8]) -> Result<Decoded<OptionHeader>, ProtocolError> {
    if b.len() < OPTION_HEADER_BYTES {
        return Ok(Decoded::Incomplete);
    }
    let magic = be64(b);
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadMagic(magic));
    }
    let header = OptionHeader { option: be32(&b[8..]), len: be32(&b[12..]) };
    if header.len > OPTION_BYTES_MAX {
        return Err(ProtocolError::OptionTooLarge(header.len));
    }
    Ok(Decoded::Item(header, OPTION_HEADER_BYTES))
}

/// The payload of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Decode an INFO/GO payload; `None` if it is malformed (the option is answered with
/// `REP_ERR_INVALID`, the connection stays).
pub fn decode_info_request(payload: &[u8]) -> Option<InfoRequest> {
    if payload.len() < 4 {
        return None;
    }
    let name_len = usize::try_from(be32(payload)).ok()?;
    if name_len > EXPORT_NAME_BYTES_MAX || payload.len() < 4 + name_len + 2 {
        return None;
    }
    let name = String::from_utf8(payload[4..4 + name_len].to_vec()).ok()?;
    let rest = &payload[4 + name_len..];
    let count = usize::from(be16(rest));
    if rest.len() != 2 + 2 * count {
        return None;
    }
    let requests = (0..count).map(|i| be16(&rest[2 + 2 * i..])).collect();
    Some(InfoRequest { name, requests })
}

/// An option reply: header and payload.
pub fn option_reply(option: u32, reply_type: u32, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    let len = u32::try_from(payload.len()).expect("option replies are small");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
}

/// NBD_INFO_EXPORT payload.
pub fn info_export(size_bytes: u64, transmission_flags: u16) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    out[2..10].copy_from_slice(&size_bytes.to_be_bytes());
    out[10..].copy_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// NBD_INFO_BLOCK_SIZE payload.
pub fn info_block_size(minimum: u32, preferred: u32, maximum: u32) -> [u8; 14] {
    let mut out = [0u8; 14];
    out[..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out[2..6].copy_from_slice(&minimum.to_be_bytes());
    out[6..10].copy_from_slice(&preferred.to_be_bytes());
    out[10..].copy_from_slice(&maximum.to_be_bytes());
    out
}

/// The answer to NBD_OPT_EXPORT_NAME: size, flags, and 124 zero bytes unless the client
/// asked for none.
pub fn export_name_reply(size_bytes: u64, flags: u16, no_zeroes: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
}

/// A transmission request header (a write's payload of `len` bytes follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// Bytes of payload that follow the header on the wire.
    pub fn payload_bytes(&self) -> usize {
        if self.kind == CMD_WRITE { self.len as usize } else { 0 }
    }
}

pub fn decode_request(b: &[u8]) -> Result<Decoded<Request>, ProtocolError> {
    if b.len() < REQUEST_BYTES {
        return Ok(Decoded::Incomplete);
    }
    let magic = be32(b);
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadMagic(u64::from(magic)));
    }
    let request = Request {
        flags: be16(&b[4..]),
        kind: be16(&b[6..]),
        cookie: be64(&b[8..]),
        offset: be64(&b[16..]),
        len: be32(&b[24..]),
    };
    Ok(Decoded::Item(request, REQUEST_BYTES))
}

pub fn encode_request(r: &Request, out: &mut Vec<u8>) {
    out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out.extend_from_slice(&r.flags.to_be_bytes());
    out.extend_from_slice(&r.kind.to_be_bytes());
    out.extend_from_slice(&r.cookie.to_be_bytes());
    out.extend_from_slice(&r.offset.to_be_bytes());
    out.extend_from_slice(&r.len.to_be_bytes());
}

/// A simple reply header; a successful read's data follows it.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    out[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..].copy_from_slice(&cookie.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_partial_input() {
        let r = Request { flags: CMD_FLAG_FUA, kind: CMD_WRITE, cookie: 7, offset: 4096, len: 512 };
        let mut b = vec![];
        encode_request(&r, &mut b);
        assert_eq!(b.len(), REQUEST_BYTES);
        for cut in 0..REQUEST_BYTES {
            assert_eq!(decode_request(&b[..cut]), Ok(Decoded::Incomplete));
        }
        assert_eq!(decode_request(&b), Ok(Decoded::Item(r, REQUEST_BYTES)));
        assert_eq!(r.payload_bytes(), 512);
        b[0] ^= 1;
        assert!(decode_request(&b).is_err());
    }

    #[test]
    fn info_requests_are_checked() {
        let mut p = vec![];
        p.extend_from_slice(&4u32.to_be_bytes());
        p.extend_from_slice(b"demo");
        p.extend_from_slice(&2u16.to_be_bytes());
        p.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        p.extend_from_slice(&INFO_NAME.to_be_bytes());
        let r = decode_info_request(&p).expect("valid");
        assert_eq!(r.name, "demo");
        assert_eq!(r.requests, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        // Truncated, over-long name, count that disagrees with the length.
        assert!(decode_info_request(&p[..p.len() - 1]).is_none());
        let mut long = p.clone();
        long[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_info_request(&long).is_none());
        let mut extra = p.clone();
        extra.push(0);
        assert!(decode_info_request(&extra).is_none());
    }

    #[test]
    fn option_headers_refuse_bad_magic_and_huge_payloads() {
        let mut b = vec![];
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&OPT_GO.to_be_bytes());
        b.extend_from_slice(&10u32.to_be_bytes());
        assert_eq!(
            decode_option_header(&b),
            Ok(Decoded::Item(OptionHeader { option: OPT_GO, len: 10 }, 16))
        );
        b[12..16].copy_from_slice(&(OPTION_BYTES_MAX + 1).to_be_bytes());
        assert!(decode_option_header(&b).is_err());
        b[0] = 0;
        assert!(decode_option_header(&b).is_err());
    }
}
