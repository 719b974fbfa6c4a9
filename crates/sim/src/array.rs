//! A whole array in simulation: the real control plane and the real engine shards over
//! simulated members and drivers, in one thread, deterministic for a seed.
//!
//! Owns: the array-level request table (an array request is cut into pieces by the router,
//! each piece served by one shard, the results joined), the metadata reactions to shard
//! events, time, and the crash and reassembly cycle used by the power-loss tests.

use crate::driver::SimDriver;
use crate::member::SimMember;
use flashraid_control::{ControlError, Init, MetaDevice, Metadata, Overwrite, prepare, start};
use flashraid_engine::{
    ArrayAccess, ArrayOp, Driver, Durability, MemberIo, PieceOp, Rejected, RequestError, RequestId,
    RouteError, Router, Shard, ShardConfig, ShardCounters, ShardEvent, ShardOp, ShardReply,
    ShardRequest, ShutdownState,
};
use flashraid_format::assembly::{AssemblyRequest, DirtyDegraded, StaleMembers, StrictDevices};
use flashraid_format::{NewArray, Uuid};
use flashraid_iobuf::{BufPool, IoBuf};
use flashraid_layout::{Geometry, Level, MemberIndex, StripeIndex};
use flashraid_parity::Kernel;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, VecDeque};

/// Steps a request may take before the harness calls it a hang.
const STEPS_MAX: u64 = 2_000_000;
/// Simulated microseconds per step.
const STEP_US: u64 = 10;
/// What a read's buffer holds before the engine fills it.
const READ_POISON: u8 = 0xa5;
/// Largest piece the harness cuts requests into.
const PIECE_BYTES_MAX: u64 = 256 << 10;

/// How to build a simulated array.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    pub level: Level,
    pub members: usize,
    pub spares: usize,
    pub member_bytes: u64,
    pub chunk_bytes: u64,
    pub shards: u32,
    pub init: Init,
    /// Longest IO delay in steps (0: IOs complete on the next poll, in random order).
    pub delay_steps_max: u64,
    pub config: ShardConfig,
}

impl SimOptions {
    pub fn new(seed: u64, level: Level, members: usize) -> Self {
        let mut config = ShardConfig::recommended();
        config.scratch_bytes = 4 << 20;
        config.requests_max = 256;
        config.stripes_active_max = 256;
        config.bitmap_clear_delay_us = 2_000;
        Self {
            seed,
            level,
            members,
            spares: 0,
            member_bytes: 6 << 20,
            chunk_bytes: 16 << 10,
            shards: 2,
            init: Init::Zero,
            delay_steps_max: 3,
            config,
        }
    }
}

/// A handle to a submitted array request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(u64);

#[derive(Debug)]
struct Pending {
    pieces_left: u32,
    result: Result<(), RequestError>,
    read: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug)]
struct PieceRef {
    ticket: u64,
    request_offset: usize,
    len: usize,
    is_read: bool,
}

#[allow(missing_debug_implementations)]
pub struct SimArray {
    pub devices: Vec<SimMember>,
    options: SimOptions,
    metadata: Metadata,
    shards: Vec<Shard>,
    drivers: Vec<SimDriver>,
    unsent: Vec<VecDeque<MemberIo>>,
    router: Router,
    geometry: Geometry,
    now_us: u64,
    next_id: u64,
    tickets: BTreeMap<u64, Pending>,
    pieces: BTreeMap<u64, PieceRef>,
    pool: BufPool,
    retry: VecDeque<(usize, ShardRequest)>,
    done: BTreeMap<u64, Result<Option<Vec<u8>>, RequestError>>,
    rng: StdRng,
    pub events: Vec<ShardEvent>,
    /// Metadata writes failed everywhere: the array is dead.
    pub metadata_lost: bool,
    /// Per shard: the rebuild's reported low-water stripe (empty: no rebuild).
    rebuild_done_below: Vec<u64>,
    /// Shards that finished the rebuild.
    rebuild_shards_done: usize,
    /// `start_rebuild` calls made (the shards' event generations).
    rebuild_generation: u32,
    /// A replace copying a member to its replacement (`start_replace`).
    copy: Option<SimCopy>,
    /// While set, member failures the shards report are not written to the superblocks
    /// (nor applied): the metadata owner has not got to them yet. A crash then lands between
    /// a failure and its metadata write.
    pub hold_failures: bool,
    /// Failures reported while `hold_failures` was set, in order.
    pub held_failures: Vec<MemberIndex>,
}

/// A replace by copy, as the runtime's controller runs it: a step of the copy per harness
/// step, so IO goes on around it.
#[derive(Clone, Copy, Debug)]
struct SimCopy {
    role: usize,
    old: usize,
    new: usize,
    done_bytes: u64,
}

/// Bytes one copy step moves: a copy of a test member takes longer than the write-intent
/// clearing delay, so regions written behind the copy are cleared into the missed-write map
/// before the swap (the path that must not lose them), not only still marked dirty.
const COPY_STEP_BYTES: u64 = 4 << 10;

fn dyn_devices(devices: &[SimMember]) -> Vec<&dyn MetaDevice> {
    devices.iter().map(|d| d as &dyn MetaDevice).collect()
}

impl SimArray {
    /// Create a new array on fresh simulated members and start it.
    pub fn create(options: SimOptions) -> Result<Self, ControlError> {
        let total = options.members + options.spares;
        let devices: Vec<SimMember> =
            (0..total).map(|i| SimMember::new(&format!("sim{i}"), options.member_bytes)).collect();
        let mut rng = StdRng::seed_from_u64(options.seed ^ 0xc0ffee);
        let mut uuid = || Uuid::from_random_bytes(rng.random());
        let new = NewArray {
            array_uuid: uuid(),
            array_name: "sim".to_string(),
            created_at_unix_seconds: 0,
            level: options.level,
            chunk_bytes: options.chunk_bytes,
            member_uuids: (0..options.members).map(|_| uuid()).collect(),
            member_sizes_bytes: vec![],
            spare_uuids: (0..options.spares).map(|_| uuid()).collect(),
            spare_sizes_bytes: vec![],
            bitmap_region_bytes: Some(1 << 20),
            shards: options.shards,
            member_data_bytes_max: None,
            tunables: Default::default(),
        };
        let all = dyn_devices(&devices);
        let (members, spares) = all.split_at(options.members);
        flashraid_control::create(&new, members, spares, Overwrite::Refuse, options.init)?;
        Self::assemble(devices, options, DirtyDegraded::Refuse)
    }

    /// Assemble an array from members (for example after a crash) and start it.
    pub fn assemble(
        devices: Vec<SimMember>,
        options: SimOptions,
        dirty_degraded: DirtyDegraded,
    ) -> Result<Self, ControlError> {
        Self::assemble_with(devices, options, dirty_degraded, StaleMembers::LeaveOut)
    }

    /// `assemble` as `--force` does: dirty and degraded accepted, and stale copies or
    /// members failed past the tolerance used where the array cannot start without them.
    pub fn assemble_forced(
        devices: Vec<SimMember>,
        options: SimOptions,
    ) -> Result<Self, ControlError> {
        Self::assemble_with(devices, options, DirtyDegraded::Force, StaleMembers::UseIfNeeded)
    }

    fn assemble_with(
        devices: Vec<SimMember>,
        options: SimOptions,
        dirty_degraded: DirtyDegraded,
        stale: StaleMembers,
    ) -> Result<Self, ControlError> {
        let all = dyn_devices(&devices);
        let request = AssemblyRequest {
            array_uuid: None,
            array_name: None,
            strict: StrictDevices::Strict,
            dirty_degraded,
            stale,
        };
        let prepared = prepare(&all, &request)?;
        let (metadata, setups) = start(
            &all,
            &prepared,
            options.shards,
            options.config,
            Kernel::best(),
            ArrayAccess::ReadWrite,
        )?;
        let geometry = prepared.assembled.geometry;
        let mut shards = vec![];
        for setup in setups {
            shards.push(Shard::new(setup).map_err(|e| ControlError::Invalid(e.to_string()))?);
        }
        let shard_count = shards.len();
        let resumed = metadata.rebuild_in_progress();
        if let Some((role, from)) = resumed {
            let zeroes =
                metadata.role_device(role.get()).is_some_and(|d| devices[d].zeroes_after_discard());
            let partial = metadata.rebuild_is_partial();
            for shard in &mut shards {
                shard.start_rebuild(role, from, zeroes, partial);
            }
        }
        // Shard drivers see role slots as member indices: map each role to its device.
        let drivers = (0..options.shards)
            .map(|s| {
                let role_devices: Vec<SimMember> = (0..geometry.member_count())
                    .map(|role| match metadata.role_device(role) {
                        Some(d) => devices[d].clone(),
                        None => SimMember::gone(&format!("missing role {role}")),
                    })
                    .collect();
                let rng = StdRng::seed_from_u64(options.seed.wrapping_add(u64::from(s) * 7919));
                SimDriver::new(role_devices, rng, options.delay_steps_max)
            })
            .collect();
        let pool_classes: Vec<(usize, usize)> =
            vec![(4096, 4096), (16384, 1024), (65536, 512), (262144, 128)];
        let run_bytes = options.config.stripe_run_member_bytes;
        let router = Router::new(geometry, options.shards, run_bytes, PIECE_BYTES_MAX);
        let rng = StdRng::seed_from_u64(options.seed ^ 0x5eed);
        Ok(Self {
            devices,
            unsent: (0..options.shards).map(|_| VecDeque::new()).collect(),
            options,
            metadata,
            shards,
            drivers,
            router,
            geometry,
            now_us: 0,
            next_id: 1,
            tickets: BTreeMap::new(),
            pieces: BTreeMap::new(),
            pool: BufPool::new(&pool_classes).expect("valid classes"),
            retry: VecDeque::new(),
            done: BTreeMap::new(),
            rng,
            events: vec![],
            hold_failures: false,
            held_failures: vec![],
            metadata_lost: false,
            rebuild_done_below: resumed
                .map(|(_, from)| vec![from.0; shard_count])
                .unwrap_or_default(),
            rebuild_shards_done: 0,
            rebuild_generation: u32::from(resumed.is_some()),
            copy: None,
        })
        .map(|mut array| {
            array.take_spare_if_wanted();
            array
        })
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub fn array_bytes(&self) -> u64 {
        self.geometry.array_bytes()
    }

    pub fn options(&self) -> &SimOptions {
        &self.options
    }

    /// The simulated device holding a role (None if missing or failed).
    pub fn role_device(&self, role: usize) -> Option<SimMember> {
        self.metadata.role_device(role).map(|d| self.devices[d].clone())
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn counters(&self) -> ShardCounters {
        let mut total = ShardCounters::default();
        for s in &self.shards {
            total.add(&s.counters());
        }
        total
    }

    pub fn is_resyncing(&self) -> bool {
        self.shards.iter().any(|s| s.is_resyncing())
    }

    // ------------------------------------------------------------------------------------
    // Requests

    /// Submit an array request. Writes take their data from `data`.
    pub fn submit(&mut self, op: ArrayOp, data: Option<&[u8]>) -> Result<Ticket, RouteError> {
        let mut pieces = vec![];
        self.router.split(op, &mut |p| pieces.push(p))?;
        let ticket = self.next_id;
        self.next_id += 1;
        let read = match op {
            ArrayOp::Read { len_bytes, .. } => {
                Some(vec![0u8; usize::try_from(len_bytes).expect("fits")])
            }
            _ => None,
        };
        let count = u32::try_from(pieces.len()).expect("fits");
        if count == 0 {
            // Nothing to do (a discard smaller than a stripe): done at once.
            self.done.insert(ticket, Ok(read));
            return Ok(Ticket(ticket));
        }
        self.tickets.insert(ticket, Pending { pieces_left: count, result: Ok(()), read });
        for piece in pieces {
            let id = self.next_id;
            self.next_id += 1;
            let (op, buf, reference) = self.piece_request(ticket, piece.op, data);
            self.pieces.insert(id, reference);
            let request = ShardRequest { id: RequestId(id), op, buf };
            self.send(usize::try_from(piece.shard).expect("fits"), request);
        }
        Ok(Ticket(ticket))
    }

    fn piece_request(
        &mut self,
        ticket: u64,
        op: PieceOp,
        data: Option<&[u8]>,
    ) -> (ShardOp, Option<IoBuf>, PieceRef) {
        let reference = |at: u64, len: u32, is_read| PieceRef {
            ticket,
            request_offset: usize::try_from(at).expect("fits"),
            len: usize::try_from(len).expect("fits"),
            is_read,
        };
        match op {
            PieceOp::Read { offset, len_bytes, request_offset } => {
                let mut buf = self.take_buf(len_bytes);
                // Poisoned, so a byte the engine never wrote (a read path that put data in
                // the wrong place) cannot pass for what an earlier read left there.
                buf.as_mut_slice()[..usize::try_from(len_bytes).expect("fits")].fill(READ_POISON);
                (
                    ShardOp::Read { offset, len_bytes },
                    Some(buf),
                    reference(request_offset, len_bytes, true),
                )
            }
            PieceOp::Write { offset, len_bytes, request_offset, durability } => {
                let mut buf = self.take_buf(len_bytes);
                let data = data.expect("writes carry data");
                let at = usize::try_from(request_offset).expect("fits");
                let len = usize::try_from(len_bytes).expect("fits");
                buf.as_mut_slice()[..len].copy_from_slice(&data[at..at + len]);
                let op = ShardOp::Write { offset, len_bytes, durability };
                (op, Some(buf), reference(request_offset, len_bytes, false))
            }
            PieceOp::WriteZeroes { offset, len_bytes, durability } => {
                let mut buf = self.take_buf(len_bytes);
                buf.as_mut_slice().fill(0);
                (
                    ShardOp::Write { offset, len_bytes, durability },
                    Some(buf),
                    reference(0, 0, false),
                )
            }
            PieceOp::Zero { stripe, how, durability } => {
                (ShardOp::Zero { stripe, how, durability }, None, reference(0, 0, false))
            }
            PieceOp::Flush => (ShardOp::Flush, None, reference(0, 0, false)),
        }
    }

    fn take_buf(&mut self, len_bytes: u32) -> IoBuf {
        self.pool
            .take(usize::try_from(len_bytes).expect("fits"))
            .expect("the harness pool is sized for the tests' concurrency")
    }

    fn send(&mut self, shard: usize, request: ShardRequest) {
        if let Err(Rejected::Busy(request)) = self.shards[shard].submit(request) {
            self.retry.push_back((shard, request));
        }
    }

    /// The result of a finished request: `Ok(Some(data))` for reads.
    pub fn take_result(&mut self, ticket: Ticket) -> Option<Result<Option<Vec<u8>>, RequestError>> {
        self.done.remove(&ticket.0)
    }

    pub fn is_done(&self, ticket: Ticket) -> bool {
        self.done.contains_key(&ticket.0)
    }

    /// Run until `ticket` finishes; return its result.
    pub fn wait(&mut self, ticket: Ticket) -> Result<Option<Vec<u8>>, RequestError> {
        let mut steps = 0;
        while !self.is_done(ticket) {
            self.step();
            steps += 1;
            assert!(steps < STEPS_MAX, "request {ticket:?} hung: {}", self.describe());
        }
        self.take_result(ticket).expect("done")
    }

    /// Fill the whole array with bytes drawn from `rng`, written 256 KiB at a time and
    /// flushed; returns them (the model the tests read back against).
    pub fn fill_random(&mut self, rng: &mut impl rand::Rng) -> Vec<u8> {
        let mut data = vec![0u8; usize::try_from(self.array_bytes()).expect("fits")];
        rng.fill(data.as_mut_slice());
        for (i, piece) in data.chunks(256 << 10).enumerate() {
            self.write(i as u64 * (256 << 10), piece).expect("the fill is written");
        }
        self.flush().expect("the fill is flushed");
        data
    }

    /// Silent corruption: flip `len` bytes of role `role`'s device at byte `at` (XOR 0x5a),
    /// in its cache and durably, as a lost or misdirected write leaves them.
    pub fn flip_member_bytes(&self, role: usize, at: u64, len: usize) {
        let device = self.role_device(role).expect("a device in that role");
        let mut s = device.state();
        let at = usize::try_from(at).expect("fits");
        for b in at..at + len {
            s.current[b] ^= 0x5a;
            s.durable[b] ^= 0x5a;
        }
    }

    /// `len` bytes of role `role`'s device at byte `at`, as it holds them now.
    pub fn member_bytes(&self, role: usize, at: u64, len: u64) -> Vec<u8> {
        let device = self.role_device(role).expect("a device in that role");
        let at = usize::try_from(at).expect("fits");
        let len = usize::try_from(len).expect("fits");
        device.state().current[at..at + len].to_vec()
    }

    /// The member byte offset of `stripe`'s chunks (the data area's start included).
    pub fn chunk_offset(&self, stripe: u64) -> u64 {
        self.metadata.superblock().data_offset_bytes
            + self.geometry.member_offset(StripeIndex(stripe), 0).0
    }

    /// The role holding data chunk `index` of `stripe` (its first copy on mirrors).
    pub fn data_role(&self, stripe: u64, index: usize) -> usize {
        self.geometry.data_member(StripeIndex(stripe), index, 0).get()
    }

    /// `MemberFailed` events so far, formatted (for assertions that none came).
    pub fn member_failures(&self) -> Vec<String> {
        self.events
            .iter()
            .filter(|e| matches!(e, ShardEvent::MemberFailed { .. }))
            .map(|e| format!("{e:?}"))
            .collect()
    }

    /// Write `len` bytes drawn from `rng` at `at` and record them in `model` (the bytes the
    /// array must hold).
    pub fn write_random(
        &mut self,
        model: &mut [u8],
        at: usize,
        len: usize,
        rng: &mut impl rand::Rng,
    ) {
        let mut piece = vec![0u8; len];
        rng.fill(piece.as_mut_slice());
        self.write(at as u64, &piece).expect("the write is taken");
        model[at..at + len].copy_from_slice(&piece);
    }

    /// Read every 4 KiB block: a read that succeeds must return `data`'s block (a panic
    /// naming `what` and the block otherwise). Returns the blocks read and refused.
    pub fn reads_never_wrong(&mut self, data: &[u8], what: &str) -> (usize, usize) {
        let (mut good, mut refused) = (0, 0);
        for (i, block) in data.chunks(4096).enumerate() {
            match self.read(i as u64 * 4096, 4096) {
                Ok(got) => {
                    assert!(got == block, "{what}: block {i} reads neither refused nor as written");
                    good += 1;
                }
                Err(_) => refused += 1,
            }
        }
        (good, refused)
    }

    pub fn read(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, RequestError> {
        let op = ArrayOp::Read { offset: flashraid_layout::ArrayOffset(offset), len_bytes: len };
        let ticket = self.submit(op, None).expect("valid range");
        self.wait(ticket).map(|d| d.expect("read data"))
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RequestError> {
        let op = ArrayOp::Write {
            offset: flashraid_layout::ArrayOffset(offset),
            len_bytes: data.len() as u64,
            durability: Durability::Cached,
        };
        let ticket = self.submit(op, Some(data)).expect("valid range");
        self.wait(ticket).map(|_| ())
    }

    pub fn flush(&mut self) -> Result<(), RequestError> {
        let ticket = self.submit(ArrayOp::Flush, None).expect("flush is always valid");
        self.wait(ticket).map(|_| ())
    }

    // ------------------------------------------------------------------------------------
    // The event loop

    /// One step: time passes, IOs move, completions and replies are handled.
    pub fn step(&mut self) {
        self.now_us += STEP_US;
        for _ in 0..self.retry.len() {
            let Some((shard, request)) = self.retry.pop_front() else { break };
            self.send(shard, request);
        }
        for s in 0..self.shards.len() {
            self.shards[s].tick(self.now_us);
            self.move_ios(s);
            let shard = &mut self.shards[s];
            self.drivers[s].poll(&mut |c| shard.complete_io(c));
            self.move_ios(s);
            while let Some(reply) = self.shards[s].poll_reply() {
                self.on_reply(reply);
            }
        }
        self.handle_events();
        self.copy_step();
    }

    /// Replace `role` by copying its member to `spare` (a device listed as a hot spare)
    /// while IO goes on: every shard records the regions written meanwhile, and when the
    /// copy is done the member is failed and the spare takes the role with a partial
    /// rebuild of those regions (like `flashraid replace`).
    pub fn start_replace(&mut self, role: usize, spare: usize) {
        assert!(self.metadata.spare_devices().contains(&spare), "not a spare");
        // The runtime refuses (and a resumed replace waits) until resync is done: the swap
        // at the copy's end would leave the stripes still to resync degraded and untrusted.
        assert!(!self.resync_pending(), "a replace while resync is pending");
        let old = self.metadata.role_device(role).expect("role held");
        for shard in &mut self.shards {
            shard.set_copy_recording(true);
        }
        self.copy = Some(SimCopy { role, old, new: spare, done_bytes: 0 });
    }

    /// Read the whole array (in 1 MiB pieces: the harness's buffer pool holds a few MiB in
    /// flight) and panic, saying `what` and the first differing byte, unless it equals
    /// `model`.
    pub fn check_model(&mut self, model: &[u8], what: &str) {
        for (i, expected) in model.chunks(1 << 20).enumerate() {
            let at = (i << 20) as u64;
            let got = self.read(at, expected.len() as u64).unwrap();
            if got != expected {
                let first = got.iter().zip(expected).position(|(a, b)| a != b).unwrap();
                panic!("{what}: array differs from the model at byte {}", at as usize + first);
            }
        }
    }

    /// Fail members other than `keep` up to the level's tolerance, so that reads of data on
    /// the failed ones depend on `keep` (on RAID 10 its mirror partner), and let the failures
    /// settle.
    pub fn fail_all_but(&mut self, keep: usize) {
        let members = self.geometry.member_count();
        let tolerance = self.geometry.tolerance();
        let raid10 = self.geometry.level() == flashraid_layout::Level::Raid10;
        let victims: Vec<usize> = (0..members)
            .filter(|&r| r != keep && (!raid10 || r == (keep ^ 1)))
            .take(tolerance)
            .collect();
        for r in victims {
            self.fail_member(r);
        }
        self.run_until_idle();
    }

    /// Some shard still has stripes an unclean shutdown left to resync (running or stopped).
    pub fn resync_pending(&self) -> bool {
        self.shards.iter().any(|s| s.resync_pending())
    }

    /// Whether a replace is still copying.
    pub fn is_copying(&self) -> bool {
        self.copy.is_some()
    }

    fn copy_step(&mut self) {
        let Some(c) = self.copy.as_mut() else { return };
        let sb = self.metadata.superblock();
        let total = sb.member_data_bytes;
        let len = COPY_STEP_BYTES.min(total - c.done_bytes);
        let offset = sb.data_offset_bytes + c.done_bytes;
        let mut buf = flashraid_iobuf::IoBuf::new(usize::try_from(len).expect("fits"));
        self.devices[c.old].read_at(buf.as_mut_slice(), offset).expect("the old member reads");
        self.devices[c.new].write_at(buf.as_slice(), offset).expect("the new device writes");
        c.done_bytes += len;
        if c.done_bytes < total {
            return;
        }
        let c = self.copy.take().expect("running");
        self.devices[c.new].sync().expect("the new device syncs");
        let role = MemberIndex(u16::try_from(c.role).expect("fits"));
        self.record_failed(&[role]);
        let devices = dyn_devices(&self.devices);
        let Ok(device) = self.metadata.take_spare(&devices, role, Some(c.new), true, None) else {
            self.metadata_lost = true;
            return;
        };
        let member = self.devices[device].clone();
        let zeroes = member.zeroes_after_discard();
        self.begin_rebuild(role, member, zeroes, true);
        for shard in &mut self.shards {
            shard.set_copy_recording(false);
        }
    }

    fn move_ios(&mut self, s: usize) {
        while let Some(io) = self.unsent[s].pop_front() {
            let (member, token) = (io.member, io.token);
            if let Err(io) = self.drivers[s].submit(io) {
                self.unsent[s].push_front(io);
                return;
            }
            self.shards[s].io_submitted(member, token);
        }
        while let Some(io) = self.shards[s].poll_io() {
            let (member, token) = (io.member, io.token);
            match self.drivers[s].submit(io) {
                Ok(()) => self.shards[s].io_submitted(member, token),
                Err(io) => self.unsent[s].push_back(io),
            }
        }
    }

    fn on_reply(&mut self, reply: ShardReply) {
        let piece = self.pieces.remove(&reply.id.0).expect("reply for a piece we sent");
        let pending = self.tickets.get_mut(&piece.ticket).expect("ticket of a piece");
        if let Some(buf) = reply.buf {
            if piece.is_read && reply.result.is_ok() {
                let out = pending.read.as_mut().expect("read ticket");
                out[piece.request_offset..piece.request_offset + piece.len]
                    .copy_from_slice(&buf.as_slice()[..piece.len]);
            }
            self.pool.give(buf);
        }
        if let Err(e) = reply.result {
            pending.result = Err(e);
        }
        pending.pieces_left -= 1;
        if pending.pieces_left == 0 {
            let pending = self.tickets.remove(&piece.ticket).expect("present");
            let result = pending.result.map(|()| pending.read);
            self.done.insert(piece.ticket, result);
        }
    }

    fn handle_events(&mut self) {
        let mut failed: Vec<MemberIndex> = vec![];
        let mut progress = false;
        let mut finished = false;
        for s in 0..self.shards.len() {
            while let Some(event) = self.shards[s].poll_event() {
                match &event {
                    ShardEvent::MemberFailed { member, .. } if !failed.contains(member) => {
                        failed.push(*member)
                    }
                    ShardEvent::ErrorCorrected { member } => {
                        self.metadata.note_errors_corrected(*member, 1)
                    }
                    ShardEvent::RebuildProgress { done_below, generation, .. }
                        if *generation == self.rebuild_generation =>
                    {
                        if let Some(d) = self.rebuild_done_below.get_mut(s) {
                            *d = (*d).max(done_below.0);
                            progress = true;
                        }
                    }
                    ShardEvent::RebuildDone { generation, .. }
                        if *generation == self.rebuild_generation =>
                    {
                        if let Some(d) = self.rebuild_done_below.get_mut(s)
                            && *d < self.geometry.stripes()
                        {
                            *d = self.geometry.stripes();
                            self.rebuild_shards_done += 1;
                            finished = self.rebuild_shards_done == self.shards.len();
                        }
                    }
                    _ => {}
                }
                self.events.push(event);
            }
        }
        if self.hold_failures {
            for member in failed.drain(..) {
                if !self.held_failures.contains(&member) {
                    self.held_failures.push(member);
                }
            }
        }
        if !failed.is_empty() {
            self.record_failed(&failed);
        }
        if finished && self.metadata.rebuild_in_progress().is_some() {
            let devices = dyn_devices(&self.devices);
            match self.metadata.finish_rebuild(&devices) {
                Ok(role) => {
                    let clear = self.metadata.all_in_service();
                    for shard in &mut self.shards {
                        shard.finish_rebuild(role);
                        if clear {
                            shard.clear_missed();
                        }
                    }
                }
                Err(_) => self.metadata_lost = true,
            }
            self.rebuild_done_below.clear();
            self.rebuild_shards_done = 0;
        } else if progress && let Some(&cursor) = self.rebuild_done_below.iter().min() {
            let devices = dyn_devices(&self.devices);
            if self.metadata.record_rebuild_progress(&devices, StripeIndex(cursor)).is_err() {
                self.metadata_lost = true;
            }
        }
        // Roles a metadata write failed (a superblock write refused by a device): the shards
        // are told like of any failure before a spare may take one (as the runtime's
        // `tell_shards_of_failures`; found by review: the simulator never told them).
        loop {
            let unapplied = self.metadata.take_unapplied_failures();
            if unapplied.is_empty() {
                break;
            }
            self.record_failed(&unapplied);
        }
        self.take_spare_if_wanted();
    }

    /// A failed role and a hot spare: the spare takes the role and the rebuild starts.
    fn take_spare_if_wanted(&mut self) {
        let Some(role) = self.metadata.spare_wanted() else { return };
        let devices = dyn_devices(&self.devices);
        let Ok(device) = self.metadata.take_spare(&devices, role, None, false, None) else {
            self.metadata_lost = true;
            return;
        };
        let member = self.devices[device].clone();
        let zeroes = member.zeroes_after_discard();
        // IO for the failed device that never reached a driver must not reach the new one.
        self.begin_rebuild(role, member, zeroes, false);
    }

    /// Map `role` to `member` in every driver (IO queued for the old device fails first) and
    /// start its rebuild on every shard.
    fn begin_rebuild(&mut self, role: MemberIndex, member: SimMember, zeroes: bool, partial: bool) {
        for s in 0..self.shards.len() {
            let (stale, kept): (Vec<MemberIo>, Vec<MemberIo>) =
                self.unsent[s].drain(..).partition(|io| io.member == role);
            self.unsent[s] = kept.into();
            for io in stale {
                self.shards[s].complete_unsubmitted_io(flashraid_engine::MemberCompletion {
                    token: io.token,
                    result: Err(flashraid_engine::IoError::Gone),
                });
            }
            self.shards[s].cancel_queued_io(role);
        }
        for driver in &mut self.drivers {
            driver.set_member(role.get(), member.clone());
        }
        for shard in &mut self.shards {
            shard.start_rebuild(role, StripeIndex(0), zeroes, partial);
        }
        self.rebuild_generation = self.rebuild_generation.wrapping_add(1);
        self.rebuild_done_below = vec![0; self.shards.len()];
        self.rebuild_shards_done = 0;
    }

    /// Scrub the whole array (`repair`: rewrite what disagrees) and return the summed tally
    /// and the first reason a shard stopped early, if any.
    pub fn scrub(&mut self, repair: bool) -> (flashraid_engine::ScrubTally, Option<&'static str>) {
        let first_event = self.events.len();
        for shard in &mut self.shards {
            shard.start_scrub(repair, 0);
        }
        let mut steps = 0;
        loop {
            let done: Vec<_> = self.events[first_event..]
                .iter()
                .filter_map(|e| match e {
                    ShardEvent::ScrubDone { tally, stopped } => Some((*tally, *stopped)),
                    _ => None,
                })
                .collect();
            if done.len() == self.shards.len() {
                let mut total = flashraid_engine::ScrubTally::default();
                for (t, _) in &done {
                    total.add(t);
                }
                return (total, done.iter().find_map(|(_, s)| *s));
            }
            self.step();
            steps += 1;
            assert!(steps < STEPS_MAX, "scrub never finished: {}", self.describe());
        }
    }

    /// Whether a role is fully in service: recorded active, held by a device that is there.
    pub fn role_in_service(&self, role: usize) -> bool {
        let active = self.metadata.superblock().members[role].state
            == flashraid_format::superblock::MemberState::Active;
        active && self.role_device(role).is_some_and(|d| !d.state().gone)
    }

    /// Run until the rebuild (and any rebuild a spare starts after it) has finished.
    pub fn run_until_rebuilt(&mut self) {
        let mut steps = 0;
        while self.is_rebuilding() || self.metadata.spare_wanted().is_some() {
            self.step();
            steps += 1;
            assert!(steps < STEPS_MAX, "rebuild never finished: {}", self.describe());
        }
    }

    /// Whether a rebuild is running (started and not recorded finished).
    pub fn is_rebuilding(&self) -> bool {
        self.metadata.rebuild_in_progress().is_some()
    }

    fn record_failed(&mut self, failed: &[MemberIndex]) {
        if self.copy.take().is_some() {
            // A failure during a replace's copy gives the copy up (the runtime does the same).
            for shard in &mut self.shards {
                shard.set_copy_recording(false);
            }
        }
        let devices = dyn_devices(&self.devices);
        let all = match self.metadata.fail_members(&devices, failed) {
            Ok(all) => all,
            Err(_) => {
                self.metadata_lost = true;
                failed.to_vec()
            }
        };
        for shard in &mut self.shards {
            shard.apply_failed(&all);
        }
        if self.metadata.rebuild_in_progress().is_none() {
            self.rebuild_done_below.clear();
            self.rebuild_shards_done = 0;
        }
    }

    /// A member device that left (failed by `fail_member`) comes back and is re-added to its
    /// role if the metadata allows (`Metadata::re_add`): only what it missed is rebuilt.
    /// Returns why not otherwise (the device is left out).
    pub fn re_add(&mut self, device: usize) -> Result<MemberIndex, String> {
        self.devices[device].state().gone = false;
        let devices = dyn_devices(&self.devices);
        let role = match self.metadata.re_add(&devices, device) {
            Ok(role) => role,
            Err(e) => {
                self.devices[device].state().gone = true;
                return Err(e.to_string());
            }
        };
        let member = self.devices[device].clone();
        let zeroes = member.zeroes_after_discard();
        self.begin_rebuild(role, member, zeroes, true);
        Ok(role)
    }

    /// A device that was left out (for example a member pulled before a reassembly) is
    /// plugged in again; returns its index for `re_add`.
    pub fn add_device(&mut self, device: SimMember) -> usize {
        self.devices.push(device);
        self.devices.len() - 1
    }

    /// Regions set in the missed-write map, summed over shards.
    pub fn missed_regions_set(&self) -> usize {
        self.shards.iter().map(Shard::missed_regions_set).sum()
    }

    /// Rebuild progress of every shard (for tests that look at what a rebuild did).
    pub fn rebuild_statuses(&self) -> Vec<Option<flashraid_engine::RebuildStatus>> {
        self.shards.iter().map(Shard::rebuild_status).collect()
    }

    /// The operator fails a member (like `flashraid fail`).
    /// `Shard::set_rebuild_trust_parity` on every shard (what the controller broadcasts).
    pub fn set_rebuild_trust_parity(&mut self, on: bool) {
        for shard in &mut self.shards {
            shard.set_rebuild_trust_parity(on);
        }
    }

    pub fn fail_member(&mut self, role: usize) {
        let member = MemberIndex(u16::try_from(role).expect("fits"));
        self.record_failed(&[member]);
        // The member is no longer read or written by the shards; make its device vanish so a
        // stray IO would show.
        if let Some(device) = self.role_device_any(role) {
            device.state().gone = true;
        }
    }

    fn role_device_any(&self, role: usize) -> Option<SimMember> {
        self.drivers.first().map(|d| d.member(role))
    }

    /// Run until nothing is in flight and no background work remains (or `steps_max`).
    pub fn run_until_idle(&mut self) {
        let mut steps = 0;
        loop {
            self.step();
            let idle = self.tickets.is_empty()
                && self.retry.is_empty()
                && self.shards.iter().all(|s| s.is_idle() && !s.is_resyncing())
                && self.drivers.iter().all(|d| d.in_flight() == 0);
            if idle {
                return;
            }
            steps += 1;
            assert!(steps < STEPS_MAX, "array never went idle: {}", self.describe());
        }
    }

    /// Run `steps` steps of simulated time.
    pub fn run_steps(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} tickets open, {} retries, driver in flight {:?}, shards {:#?}",
            self.tickets.len(),
            self.retry.len(),
            self.drivers.iter().map(|d| d.in_flight()).collect::<Vec<_>>(),
            self.shards.iter().map(|s| s.describe()).collect::<Vec<_>>(),
        )
    }

    // ------------------------------------------------------------------------------------
    // Shutdown and crash

    /// Clean shutdown: finish everything, then every shard flushes and clears its bitmap;
    /// the array is marked clean only if every shard ends clean (otherwise it stays dirty and
    /// the next assembly resyncs what is left). Returns the members and whether it is clean.
    pub fn shutdown_with_state(self) -> Result<(Vec<SimMember>, bool), ControlError> {
        self.shutdown_marking_with(|metadata, devices| {
            let devices = dyn_devices(devices);
            metadata.mark_clean(&devices)
        })
    }

    /// `shutdown_with_state`, with `mark` doing the clean stop's metadata writes (a test
    /// wraps the members to cut power in the middle of them).
    pub fn shutdown_marking_with(
        mut self,
        mark: impl FnOnce(&mut Metadata, &[SimMember]) -> Result<(), ControlError>,
    ) -> Result<(Vec<SimMember>, bool), ControlError> {
        self.run_until_idle();
        self.stop_marking_with(mark)
    }

    /// A clean stop while background work (resync, init) still runs, as the runtime's stop
    /// does: requests finish, resync stops where it is and keeps its regions dirty.
    pub fn shutdown_during_background_work(mut self) -> Result<Vec<SimMember>, ControlError> {
        let mut steps = 0;
        while !(self.tickets.is_empty()
            && self.retry.is_empty()
            && self.drivers.iter().all(|d| d.in_flight() == 0))
        {
            self.step();
            steps += 1;
            assert!(steps < STEPS_MAX, "requests never finished: {}", self.describe());
        }
        self.stop_marking_with(|metadata, devices| metadata.mark_clean(&dyn_devices(devices)))
            .map(|(devices, _)| devices)
    }

    fn stop_marking_with(
        mut self,
        mark: impl FnOnce(&mut Metadata, &[SimMember]) -> Result<(), ControlError>,
    ) -> Result<(Vec<SimMember>, bool), ControlError> {
        for shard in &mut self.shards {
            shard.begin_shutdown();
        }
        let mut steps = 0;
        let mut clean = true;
        let mut in_init = true;
        for s in 0..self.shards.len() {
            loop {
                match self.shards[s].shutdown_state() {
                    ShutdownState::Done { clean: c } => {
                        clean &= c;
                        in_init &= c || self.shards[s].stopped_with_only_init_left();
                        break;
                    }
                    _ => self.step(),
                }
                steps += 1;
                assert!(steps < STEPS_MAX, "shutdown never finished: {}", self.describe());
            }
        }
        if clean && !self.metadata_lost {
            mark(&mut self.metadata, &self.devices)?;
        } else if in_init && !self.metadata_lost {
            // As the runtime does: background init stopped halfway, nothing else left.
            self.metadata.mark_stopped_in_init(&dyn_devices(&self.devices))?;
        }
        Ok((self.devices, clean && !self.metadata_lost))
    }

    /// `shutdown_with_state`, for callers that only need the members.
    pub fn shutdown(self) -> Result<Vec<SimMember>, ControlError> {
        self.shutdown_with_state().map(|(devices, _)| devices)
    }

    /// Power loss now: IOs in flight are lost (or reach the cache), every member loses what
    /// it had not made durable. Returns the members for reassembly.
    pub fn crash(mut self) -> Vec<SimMember> {
        for driver in &mut self.drivers {
            driver.crash();
        }
        let mut rng = StdRng::seed_from_u64(self.rng.random());
        for device in &self.devices {
            device.state().power_loss(&mut rng);
        }
        self.devices
    }
}
