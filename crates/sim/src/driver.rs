//! The simulator's driver: member IOs complete in a seeded random order, after a seeded
//! random number of steps, against simulated members.
//!
//! This is the IO layer of the simulator, so it is where the engine's buffer pointers are
//! dereferenced, under the contract in `flashraid_engine::io`: the memory stays valid and
//! untouched by the engine until the completion is delivered. The copy happens when the IO
//! completes (one schedule a real device could produce).

use crate::member::{SimError, SimMember};
use flashraid_engine::{Driver, Durability, IoError, MemberCompletion, MemberIo, MemberIoKind};
use rand::Rng;
use rand::rngs::StdRng;

/// Most IOs one simulated driver holds in flight (like a ring's size).
pub const IN_FLIGHT_MAX: usize = 4096;

#[derive(Debug)]
pub struct SimDriver {
    members: Vec<SimMember>,
    /// Each IO with the step it may complete at and the device it was sent to (a role that
    /// changes device meanwhile does not redirect IO already in flight).
    in_flight: Vec<(MemberIo, u64, SimMember)>,
    step: u64,
    rng: StdRng,
    /// Longest delay, in driver steps, before an IO may complete (0: next poll).
    delay_steps_max: u64,
    /// In-flight IOs dropped by a simulated crash.
    pub dropped: u64,
}

impl SimDriver {
    pub fn new(members: Vec<SimMember>, rng: StdRng, delay_steps_max: u64) -> Self {
        Self {
            members,
            in_flight: Vec::with_capacity(IN_FLIGHT_MAX),
            step: 0,
            rng,
            delay_steps_max,
            dropped: 0,
        }
    }

    /// A role is now held by another device (a hot spare took it over).
    pub fn set_member(&mut self, role: usize, member: SimMember) {
        self.members[role] = member;
    }

    /// The simulated device behind a role.
    pub fn member(&self, role: usize) -> SimMember {
        self.members[role].clone()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Power is lost: IOs in flight never complete. A write in flight may or may not have
    /// reached the device's cache (the crash then decides whether it persists).
    pub fn crash(&mut self) {
        for (io, _, member) in std::mem::take(&mut self.in_flight) {
            if self.rng.random_bool(0.5) {
                let _ = Self::perform(&member, &io);
            }
            self.dropped += 1;
        }
    }

    fn perform(member: &SimMember, io: &MemberIo) -> Result<(), IoError> {
        let mut state = member.state();
        let result = match io.kind {
            MemberIoKind::Read { offset_bytes, ptr, len_bytes } => {
                let len = usize::try_from(len_bytes).expect("fits");
                // SAFETY: the engine's memory contract (flashraid_engine::io): `ptr` is valid for
                // writes of `len` bytes and untouched by the engine until this IO completes,
                // which is after this copy.
                let buf = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                state.read(buf, offset_bytes)
            }
            MemberIoKind::Write { offset_bytes, ptr, len_bytes, durability } => {
                let len = usize::try_from(len_bytes).expect("fits");
                // SAFETY: as above; the engine does not write the buffer while the IO is in
                // flight, and `ptr` is valid for reads of `len` bytes.
                let buf = unsafe { std::slice::from_raw_parts(ptr, len) };
                state.write(buf, offset_bytes, durability == Durability::Fua)
            }
            MemberIoKind::Flush => state.flush(),
            MemberIoKind::Discard { offset_bytes, len_bytes }
            | MemberIoKind::WriteZeroes { offset_bytes, len_bytes } => {
                state.zero(offset_bytes, len_bytes)
            }
        };
        result.map_err(|e| match e {
            SimError::Gone => IoError::Gone,
            SimError::Unsupported => IoError::Unsupported,
            SimError::Media | SimError::OutOfRange => IoError::Media,
        })
    }
}

impl Driver for SimDriver {
    fn submit(&mut self, io: MemberIo) -> Result<(), MemberIo> {
        if self.in_flight.len() >= IN_FLIGHT_MAX {
            return Err(io);
        }
        let ready = self.step + self.rng.random_range(0..=self.delay_steps_max);
        let member = self.members[io.member.get()].clone();
        self.in_flight.push((io, ready, member));
        Ok(())
    }

    fn poll(&mut self, sink: &mut dyn FnMut(MemberCompletion)) {
        self.step += 1;
        // Complete the ready IOs in a random order.
        let mut index = 0;
        let mut ready = vec![];
        while index < self.in_flight.len() {
            if self.in_flight[index].1 <= self.step && self.rng.random_bool(0.7) {
                let (io, _, member) = self.in_flight.swap_remove(index);
                ready.push((io, member));
            } else {
                index += 1;
            }
        }
        for (io, member) in ready {
            let result = Self::perform(&member, &io);
            sink(MemberCompletion { token: io.token, result });
        }
    }
}
