//! The engine's `Driver` over an io_uring `Ring`: member IO for one shard.
//!
//! Role `i` of the array starts as registered file `i` of the ring; hot spares are
//! registered after the roles, and a spare that takes over a role is mapped to it
//! (`assign_role`), so IO already in flight keeps its file. Missing members get a placeholder
//! descriptor that the engine never addresses (it issues no IO to unavailable members).
//! Tokens travel as io_uring user data. Short transfers are errors.

use flashraid_engine::{
    Driver, Durability, IoError, IoToken, MemberCompletion, MemberIo, MemberIoKind,
};
use flashraid_uring::{Op, Ring, RingError, check_status, check_transfer};
use std::collections::HashMap;

#[derive(Debug)]
pub struct UringDriver {
    ring: Ring,
    /// Length of each transfer in flight, to detect short ones. Pre-sized to the ring's
    /// in-flight maximum, so inserting never allocates.
    transfer_len: HashMap<u64, u32>,
    /// Registered file index per role.
    role_file: [u32; flashraid_layout::MEMBERS_MAX],
}

impl UringDriver {
    pub fn new(ring: Ring) -> Self {
        let capacity = ring.in_flight_max();
        let role_file = std::array::from_fn(|i| u32::try_from(i).expect("fits"));
        Self { ring, transfer_len: HashMap::with_capacity(capacity), role_file }
    }

    /// From now on, IO for `role` goes to registered file `file`.
    pub fn assign_role(&mut self, role: usize, file: u32) {
        self.role_file[role] = file;
    }

    pub fn ring(&mut self) -> &mut Ring {
        &mut self.ring
    }
}

impl Driver for UringDriver {
    fn submit(&mut self, io: MemberIo) -> Result<(), MemberIo> {
        let file = self.role_file[io.member.get()];
        let (op, len) = match io.kind {
            MemberIoKind::Read { offset_bytes, ptr, len_bytes } => {
                (Op::Read { file, offset_bytes, ptr, len_bytes }, Some(len_bytes))
            }
            MemberIoKind::Write { offset_bytes, ptr, len_bytes, durability } => {
                let fua = durability == Durability::Fua;
                (Op::Write { file, offset_bytes, ptr, len_bytes, fua }, Some(len_bytes))
            }
            MemberIoKind::Flush => (Op::Flush { file }, None),
            MemberIoKind::Discard { offset_bytes, len_bytes } => {
                (Op::Discard { file, offset_bytes, len_bytes }, None)
            }
            MemberIoKind::WriteZeroes { offset_bytes, len_bytes } => {
                (Op::WriteZeroes { file, offset_bytes, len_bytes }, None)
            }
        };
        // SAFETY: the engine's memory contract (flashraid_engine::io): buffers named by a
        // Read or Write stay valid and untouched until this token's completion is delivered,
        // which happens only after the ring reaps it.
        match unsafe { self.ring.push(op, io.token.0) } {
            Ok(()) => {
                if let Some(len) = len {
                    self.transfer_len.insert(io.token.0, len);
                }
                Ok(())
            }
            Err(RingError::Full) => Err(io),
            Err(e) => panic!("io_uring refused a well-formed member IO: {e}"),
        }
    }

    fn poll(&mut self, sink: &mut dyn FnMut(MemberCompletion)) {
        let lens = &mut self.transfer_len;
        self.ring.reap(|user_data, result| {
            let outcome = match lens.remove(&user_data) {
                Some(len) => check_transfer(result, len),
                None => check_status(result),
            };
            let result = outcome.map_err(|e| match e.errno() {
                Some(errno) => IoError::from_errno(errno),
                None => IoError::Media, // a short transfer: the device ended early
            });
            sink(MemberCompletion { token: IoToken(user_data), result });
        });
    }
}
