//! `flashraid bench parity`: GB/s of the parity kernels against ISA-L and the memory, one core.
//!
//! Owns: the parity benchmark's cases, its buffer pool, the interleaved measurement loop and the
//! report (a text table and a JSON document).
//!
//! Method (kept in step with docs/PERFORMANCE.md):
//! - A stripe is k data chunks (k = 10 by default) plus up to three parity chunks. Throughput is
//!   data bytes per second (k x chunk for encode and rebuild; one chunk for update), in
//!   GB/s = 10^9 B/s, the convention of ISA-L and the kernel.
//! - hot: the same stripe again and again, so it sits in L1/L2 (L3 at 256 KiB chunks).
//!   cold: successive stripes from a pool larger than the last-level cache, so data comes from
//!   DRAM and parity goes back to it.
//! - Each figure is the median of several repetitions of at least `repetition_cpu` of thread CPU
//!   time each; every implementation of a case runs in each repetition, one after another, so
//!   they share the same background load. Ratios are taken within the run.
//! - Beside each figure: ISA-L's best on the same shape (every ISA-L that could be loaded, each
//!   of its applicable functions), and the memory read bandwidth of one core over the same
//!   working set, measured in the same repetitions.
//!
//! Limits: one core; x86_64 for the SIMD kernels and ISA-L.

use crate::timing::{Measurement, measure, median};
use flashraid_isal::Isal;
use flashraid_parity::{Codec, Kernel, ReconstructPlan, Stores};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Most chunks in one benchmark stripe: data, three parity, and the new data of an update.
const STRIPE_SLOTS_MAX: usize = 40;
/// Bytes read per step of the cold memory-bandwidth probe.
const PROBE_WINDOW_BYTES: usize = 64 << 20;

/// One operation the benchmark measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    EncodeP,
    EncodePQ,
    EncodePQR,
    UpdatePQ,
    UpdatePQR,
    Rebuild1,
    Rebuild2,
    Rebuild3,
}

impl Op {
    pub const ALL: [Op; 8] = [
        Op::EncodeP,
        Op::EncodePQ,
        Op::EncodePQR,
        Op::UpdatePQ,
        Op::UpdatePQR,
        Op::Rebuild1,
        Op::Rebuild2,
        Op::Rebuild3,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Op::EncodeP => "encode P",
            Op::EncodePQ => "encode P+Q",
            Op::EncodePQR => "encode P+Q+R",
            Op::UpdatePQ => "update P+Q",
            Op::UpdatePQR => "update P+Q+R",
            Op::Rebuild1 => "rebuild 1 data",
            Op::Rebuild2 => "rebuild 2 data",
            Op::Rebuild3 => "rebuild 3 data",
        }
    }

    /// Parity chunks of the stripe shape.
    fn parity_chunks(self) -> usize {
        match self {
            Op::EncodeP => 1,
            Op::EncodePQ | Op::UpdatePQ => 2,
            _ => 3,
        }
    }

    /// Data chunks lost, for the rebuild cases: {x}, {0, x}, {0, x, k-1} with x = min(4, k/2),
    /// which for k = 10 is the research note's {4}, {0,4}, {0,4,9}.
    fn erased(self, data_chunks: usize) -> Vec<usize> {
        let x = middle_index(data_chunks);
        match self {
            Op::Rebuild1 => vec![x],
            Op::Rebuild2 => vec![0, x],
            Op::Rebuild3 => vec![0, x, data_chunks - 1],
            _ => vec![],
        }
    }

    fn is_update(self) -> bool {
        matches!(self, Op::UpdatePQ | Op::UpdatePQR)
    }
}

/// The data position the update and rebuild cases use (4 for k = 10).
fn middle_index(data_chunks: usize) -> usize {
    4.min(data_chunks / 2)
}

/// Where the stripe comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Regime {
    /// The same stripe again and again: in cache.
    Hot,
    /// Successive stripes from a pool larger than the last-level cache: from DRAM.
    Cold,
}

/// What to measure. Safety-irrelevant, so it has presets rather than a `Default`.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_chunks: usize,
    pub chunk_sizes_bytes: Vec<usize>,
    pub regimes: Vec<Regime>,
    pub ops: Vec<Op>,
    pub repetitions: usize,
    pub repetition_cpu: Duration,
    pub cold_pool_bytes: usize,
    pub kernel: Kernel,
    pub isal_paths: Vec<PathBuf>,
    pub cpu: Option<usize>,
}

impl Config {
    /// The full matrix: k = 10, 4/16/64/256 KiB, hot and cold, every op, median of 5.
    pub fn full(isal_paths: Vec<PathBuf>) -> Self {
        Self {
            data_chunks: 10,
            chunk_sizes_bytes: vec![4 << 10, 16 << 10, 64 << 10, 256 << 10],
            regimes: vec![Regime::Hot, Regime::Cold],
            ops: Op::ALL.to_vec(),
            repetitions: 5,
            repetition_cpu: Duration::from_millis(150),
            cold_pool_bytes: 2 << 30,
            kernel: Kernel::best(),
            isal_paths,
            cpu: None,
        }
    }

    /// A first look in about a tenth of the time: 3 repetitions of 40 ms, a 1 GiB pool.
    pub fn quick(isal_paths: Vec<PathBuf>) -> Self {
        Self {
            repetitions: 3,
            repetition_cpu: Duration::from_millis(40),
            cold_pool_bytes: 1 << 30,
            ..Self::full(isal_paths)
        }
    }
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("parity: {0}")]
    Parity(#[from] flashraid_parity::ParityError),
    #[error("chunk size {0} B: the benchmark takes multiples of 4096 from 4 KiB to 4 MiB")]
    ChunkSize(usize),
    #[error("{0} data chunks: the benchmark takes 3 to 32")]
    DataChunks(usize),
    #[error("cannot pin to CPU {0}: it is not one this process may run on")]
    Cpu(usize),
    #[error("the cold pool of {pool_bytes} B holds fewer than 4 stripes of {stripe_bytes} B")]
    PoolTooSmall { pool_bytes: usize, stripe_bytes: usize },
}

/// One ISA-L function's figure.
#[derive(Clone, Debug, Serialize)]
pub struct IsalFigure {
    pub version: String,
    pub function: String,
    pub gbps: f64,
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub op: Op,
    pub chunk_bytes: usize,
    pub regime: Regime,
    /// Cached stores.
    pub flashraid_gbps: f64,
    /// Non-temporal parity stores (encode and rebuild only).
    pub flashraid_nontemporal_gbps: Option<f64>,
    pub isal: Vec<IsalFigure>,
    /// flashraid's better store mode over ISA-L's best.
    pub ratio_to_isal: Option<f64>,
    /// One core reading the same working set (the stripe when hot, the pool when cold).
    pub memory_read_gbps: f64,
    /// Bytes the better flashraid mode moves per second (data read, parity written, and with
    /// cached stores the read-for-ownership of parity) over `memory_read_gbps`.
    pub traffic_fraction_of_read_bandwidth: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub kernel: String,
    pub data_chunks: usize,
    pub repetitions: usize,
    pub repetition_cpu_ms: u128,
    pub cold_pool_bytes: usize,
    pub cpu: Option<usize>,
    pub cpu_model: String,
    pub isal_libraries: Vec<(String, String)>,
    pub isal_load_errors: Vec<String>,
    pub rows: Vec<Row>,
}

/// A page-aligned byte pool, so chunks at multiples of 4 KiB are 64-byte aligned as ISA-L's
/// non-temporal functions need.
struct Pool {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Pool {
    fn new(len: usize) -> Self {
        let mut storage = vec![0u8; len + 4096];
        let start = (4096 - storage.as_ptr() as usize % 4096) % 4096;
        // Distinct, non-zero contents: every page is touched (faulted in) before timing.
        for (i, byte) in storage.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(151).wrapping_add((i >> 12) as u8);
        }
        Self { storage, start, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// An implementation measured for a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Flashraid(Stores),
    Isal { library: usize, function: IsalFunction },
    MemoryRead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IsalFunction {
    XorGen,
    PqGen,
    EncodeData,
    /// RMW as ISA-L would do it: `xor_gen` makes the delta, `ec_encode_data_update` applies it.
    XorThenUpdate,
}

impl IsalFunction {
    fn name(self) -> &'static str {
        match self {
            IsalFunction::XorGen => "xor_gen",
            IsalFunction::PqGen => "pq_gen",
            IsalFunction::EncodeData => "ec_encode_data",
            IsalFunction::XorThenUpdate => "xor_gen+ec_encode_data_update",
        }
    }

    fn applies_to(self, op: Op) -> bool {
        match self {
            IsalFunction::XorGen => op == Op::EncodeP,
            IsalFunction::PqGen => op == Op::EncodePQ,
            IsalFunction::EncodeData => !op.is_update(),
            IsalFunction::XorThenUpdate => op.is_update(),
        }
    }
}

/// Everything one (op, chunk size, regime) case needs, prepared outside the timed loops.
struct Case {
    op: Op,
    chunk_bytes: usize,
    regime: Regime,
    codec: Codec,
    plan: Option<ReconstructPlan>,
    /// Per ISA-L library: expanded tables for this op's coefficient rows.
    isal_tables: Vec<Vec<u8>>,
    /// Chunks per stripe slot group: k data, 3 parity, 1 new-data.
    slots: usize,
    /// What each slot is to this case's calls.
    roles: [Role; STRIPE_SLOTS_MAX],
    stripes: usize,
    next_stripe: usize,
}

/// Run the benchmark. `progress` receives one line per finished case.
pub fn run(config: &Config, mut progress: impl FnMut(&str)) -> Result<Report, BenchError> {
    let k = config.data_chunks;
    if !(3..=32).contains(&k) {
        return Err(BenchError::DataChunks(k));
    }
    for &size in &config.chunk_sizes_bytes {
        if size % 4096 != 0 || !(4096..=flashraid_parity::CHUNK_BYTES_MAX).contains(&size) {
            return Err(BenchError::ChunkSize(size));
        }
    }
    if let Some(cpu) = config.cpu {
        let ids = core_affinity::get_core_ids().unwrap_or_default();
        let id = ids.into_iter().find(|c| c.id == cpu).ok_or(BenchError::Cpu(cpu))?;
        if !core_affinity::set_for_current(id) {
            return Err(BenchError::Cpu(cpu));
        }
    }
    let mut libraries = vec![];
    let mut isal_load_errors = vec![];
    for path in &config.isal_paths {
        match Isal::load(path) {
            Ok(isal) => libraries.push(isal),
            Err(e) => isal_load_errors.push(e.to_string()),
        }
    }
    let slots = k + 4;
    let largest = config.chunk_sizes_bytes.iter().copied().max().unwrap_or(4096);
    let hot_bytes = slots * largest;
    let cold = config.regimes.contains(&Regime::Cold);
    let pool_bytes = if cold { config.cold_pool_bytes.max(hot_bytes) } else { hot_bytes };
    if cold && pool_bytes / (slots * largest) < 4 {
        return Err(BenchError::PoolTooSmall { pool_bytes, stripe_bytes: slots * largest });
    }
    let mut pool = Pool::new(pool_bytes);
    let mut delta = Pool::new(largest);

    let mut rows = vec![];
    for &chunk_bytes in &config.chunk_sizes_bytes {
        for &regime in &config.regimes {
            let stripes = match regime {
                Regime::Hot => 1,
                Regime::Cold => pool_bytes / (slots * chunk_bytes),
            };
            let mut cases: Vec<Case> = vec![];
            for &op in &config.ops {
                cases.push(prepare_case(config, &libraries, op, chunk_bytes, regime, stripes)?);
            }
            for case in &mut cases {
                let row = measure_case(config, &libraries, &mut pool, &mut delta, case)?;
                progress(&format_row(&row));
                rows.push(row);
            }
        }
    }
    Ok(Report {
        kernel: config.kernel.name().to_string(),
        data_chunks: k,
        repetitions: config.repetitions,
        repetition_cpu_ms: config.repetition_cpu.as_millis(),
        cold_pool_bytes: if cold { pool_bytes } else { 0 },
        cpu: config.cpu,
        cpu_model: cpu_model(),
        isal_libraries: libraries
            .iter()
            .map(|l| (l.version().to_string(), l.path().display().to_string()))
            .collect(),
        isal_load_errors,
        rows,
    })
}

fn prepare_case(
    config: &Config,
    libraries: &[Isal],
    op: Op,
    chunk_bytes: usize,
    regime: Regime,
    stripes: usize,
) -> Result<Case, BenchError> {
    let k = config.data_chunks;
    let codec = Codec::with_kernel(k, op.parity_chunks(), config.kernel)?;
    let erased = op.erased(k);
    let plan =
        if erased.is_empty() { None } else { Some(codec.plan_reconstruct(&erased, &erased)?) };
    let isal_tables = libraries
        .iter()
        .map(|isal| match &plan {
            Some(plan) => {
                let sources = plan.sources().len();
                let rows = plan.targets().len();
                let coefs: Vec<u8> = (0..rows)
                    .flat_map(|t| (0..sources).map(move |s| (t, s)))
                    .map(|(t, s)| plan.coefficient(t, s))
                    .collect();
                isal.init_tables(sources, rows, &coefs)
            }
            None => {
                let m = op.parity_chunks();
                let matrix = isal.gen_rs_matrix(k + m, k);
                isal.init_tables(k, m, &matrix[k * k..])
            }
        })
        .collect();
    let roles = roles_of(op, plan.as_ref(), k);
    Ok(Case {
        roles,
        op,
        chunk_bytes,
        regime,
        codec,
        plan,
        isal_tables,
        slots: k + 4,
        stripes,
        next_stripe: 0,
    })
}

fn contenders(op: Op, libraries: &[Isal]) -> Vec<Contender> {
    let mut list = vec![Contender::Flashraid(Stores::Cached)];
    if !op.is_update() {
        list.push(Contender::Flashraid(Stores::NonTemporal));
    }
    for library in 0..libraries.len() {
        for function in [
            IsalFunction::XorGen,
            IsalFunction::PqGen,
            IsalFunction::EncodeData,
            IsalFunction::XorThenUpdate,
        ] {
            if function.applies_to(op) {
                list.push(Contender::Isal { library, function });
            }
        }
    }
    list.push(Contender::MemoryRead);
    list
}

fn measure_case(
    config: &Config,
    libraries: &[Isal],
    pool: &mut Pool,
    delta: &mut Pool,
    case: &mut Case,
) -> Result<Row, BenchError> {
    let contenders = contenders(case.op, libraries);
    let mut figures: Vec<Vec<f64>> = vec![vec![]; contenders.len()];
    for _ in 0..config.repetitions {
        for (i, &contender) in contenders.iter().enumerate() {
            let m = measure_contender(config, libraries, pool, delta, case, contender)?;
            figures[i].push(m.gbps());
        }
    }
    let medians: Vec<f64> = figures.iter().map(|f| median(f)).collect();
    let mut row = Row {
        op: case.op,
        chunk_bytes: case.chunk_bytes,
        regime: case.regime,
        flashraid_gbps: 0.0,
        flashraid_nontemporal_gbps: None,
        isal: vec![],
        ratio_to_isal: None,
        memory_read_gbps: 0.0,
        traffic_fraction_of_read_bandwidth: 0.0,
    };
    for (contender, gbps) in contenders.iter().zip(medians) {
        match *contender {
            Contender::Flashraid(Stores::Cached) => row.flashraid_gbps = gbps,
            Contender::Flashraid(Stores::NonTemporal) => {
                row.flashraid_nontemporal_gbps = Some(gbps)
            }
            Contender::Isal { library, function } => row.isal.push(IsalFigure {
                version: libraries[library].version().to_string(),
                function: function.name().to_string(),
                gbps,
            }),
            Contender::MemoryRead => row.memory_read_gbps = gbps,
        }
    }
    let (best, nontemporal) = match row.flashraid_nontemporal_gbps {
        Some(nt) if nt > row.flashraid_gbps => (nt, true),
        _ => (row.flashraid_gbps, false),
    };
    let best_isal = row.isal.iter().map(|f| f.gbps).fold(f64::NAN, f64::max);
    if best_isal.is_finite() {
        row.ratio_to_isal = Some(best / best_isal);
    }
    row.traffic_fraction_of_read_bandwidth =
        traffic_per_data_byte(case, nontemporal) * best / row.memory_read_gbps;
    Ok(row)
}

/// Bytes moved through memory per data byte of throughput.
fn traffic_per_data_byte(case: &Case, nontemporal: bool) -> f64 {
    let k = case.codec.data_chunks() as f64;
    let m = case.codec.parity_chunks() as f64;
    match case.op {
        // Read old, new and the parity; write the parity.
        Op::UpdatePQ | Op::UpdatePQR => 2.0 + 2.0 * m,
        _ => {
            let written = case.plan.as_ref().map_or(m, |p| p.targets().len() as f64);
            let rfo = if nontemporal { 0.0 } else { written };
            (k + written + rfo) / k
        }
    }
}

/// A stripe split for one case into the arguments its calls take: `sources` (encode: the data
/// chunks; update: old and new data; rebuild: the plan's sources in plan order) and `outputs`
/// (the parity chunks, or the plan's targets). Hot cases build it once, cold cases once per
/// call, so the harness adds as little as possible to any contender's time.
struct Prepared<'a> {
    sources: [&'a [u8]; STRIPE_SLOTS_MAX],
    outputs: [&'a mut [u8]; 3],
}

/// A stripe slot's part in a case, decided once per case rather than per call.
#[derive(Clone, Copy, Debug)]
enum Role {
    Source(usize),
    Output(usize),
    Unused,
}

/// Slot layout of a benchmark stripe: `0..k` data, `k..k + 3` parity, `k + 3` new data.
fn roles_of(op: Op, plan: Option<&ReconstructPlan>, k: usize) -> [Role; STRIPE_SLOTS_MAX] {
    let mut roles = [Role::Unused; STRIPE_SLOTS_MAX];
    match plan {
        Some(plan) => {
            for (s, &chunk) in plan.sources().iter().enumerate() {
                roles[chunk] = Role::Source(s);
            }
            for (t, &chunk) in plan.targets().iter().enumerate() {
                roles[chunk] = Role::Output(t);
            }
        }
        None if op.is_update() => {
            roles[middle_index(k)] = Role::Source(0);
            roles[k + 3] = Role::Source(1);
        }
        None => {
            for (j, role) in roles.iter_mut().enumerate().take(k) {
                *role = Role::Source(j);
            }
        }
    }
    if plan.is_none() {
        for r in 0..op.parity_chunks() {
            roles[k + r] = Role::Output(r);
        }
    }
    roles
}

fn prepare<'a>(pool: &'a mut [u8], case: &mut Case) -> Prepared<'a> {
    let stripe_bytes = case.slots * case.chunk_bytes;
    let index = case.next_stripe;
    case.next_stripe = (case.next_stripe + 1) % case.stripes;
    let stripe = &mut pool[index * stripe_bytes..(index + 1) * stripe_bytes];
    let mut prepared =
        Prepared { sources: [&[]; STRIPE_SLOTS_MAX], outputs: [&mut [], &mut [], &mut []] };
    for (chunk, role) in stripe.chunks_exact_mut(case.chunk_bytes).zip(&case.roles) {
        match *role {
            Role::Source(s) => prepared.sources[s] = chunk,
            Role::Output(o) => prepared.outputs[o] = chunk,
            Role::Unused => {}
        }
    }
    prepared
}

fn measure_contender(
    config: &Config,
    libraries: &[Isal],
    pool: &mut Pool,
    delta: &mut Pool,
    case: &mut Case,
    contender: Contender,
) -> Result<Measurement, BenchError> {
    let k = config.data_chunks;
    let cpu = config.repetition_cpu;
    let chunk = case.chunk_bytes;
    let data_bytes = if case.op.is_update() { chunk } else { k * chunk } as u64;
    let hot = case.regime == Regime::Hot;
    let pool_bytes = pool.bytes();
    match contender {
        Contender::MemoryRead if hot => {
            let working = &pool_bytes[..k * chunk];
            Ok(measure(cpu, working.len() as u64, || {
                std::hint::black_box(flashraid_parity::read_probe(working));
            }))
        }
        Contender::MemoryRead => {
            // Cold: windows of the pool in turn.
            let window_bytes = PROBE_WINDOW_BYTES.min(pool_bytes.len());
            let windows = pool_bytes.len() / window_bytes;
            let mut window = 0;
            Ok(measure(cpu, window_bytes as u64, || {
                let start = window * window_bytes;
                window = (window + 1) % windows;
                let slice = &pool_bytes[start..start + window_bytes];
                std::hint::black_box(flashraid_parity::read_probe(slice));
            }))
        }
        Contender::Flashraid(stores) => {
            let call =
                FlashraidCall { codec: case.codec, op: case.op, plan: case.plan.clone(), stores };
            let mut failure = None;
            let mut record = |result: Result<(), flashraid_parity::ParityError>| {
                if let Err(e) = result {
                    failure.get_or_insert(e);
                }
            };
            let measurement = if hot {
                let mut prepared = prepare(pool_bytes, case);
                measure(cpu, data_bytes, || record(run_flashraid(&call, &mut prepared)))
            } else {
                measure(cpu, data_bytes, || {
                    let mut prepared = prepare(pool_bytes, case);
                    record(run_flashraid(&call, &mut prepared));
                })
            };
            match failure {
                Some(e) => Err(e.into()),
                None => Ok(measurement),
            }
        }
        Contender::Isal { library, function } => {
            let tables = case.isal_tables[library].clone();
            let call = IsalCall {
                isal: &libraries[library],
                function,
                tables: &tables,
                update_index: middle_index(k),
                data_chunks: k,
                source_count: case.plan.as_ref().map_or(k, |p| p.sources().len()),
                output_count: case
                    .plan
                    .as_ref()
                    .map_or(case.op.parity_chunks(), |p| p.targets().len()),
            };
            let scratch = &mut delta.bytes()[..chunk];
            Ok(if hot {
                let mut prepared = prepare(pool_bytes, case);
                measure(cpu, data_bytes, || run_isal(&call, &mut prepared, scratch))
            } else {
                measure(cpu, data_bytes, || {
                    let mut prepared = prepare(pool_bytes, case);
                    run_isal(&call, &mut prepared, scratch);
                })
            })
        }
    }
}

/// What a flashraid call needs besides the stripe.
struct FlashraidCall {
    codec: Codec,
    op: Op,
    plan: Option<ReconstructPlan>,
    stores: Stores,
}

fn run_flashraid(
    call: &FlashraidCall,
    prepared: &mut Prepared<'_>,
) -> Result<(), flashraid_parity::ParityError> {
    let codec = &call.codec;
    let k = codec.data_chunks();
    let m = codec.parity_chunks();
    let Prepared { sources, outputs } = prepared;
    match &call.plan {
        Some(plan) => {
            let (s, t) = (plan.sources().len(), plan.targets().len());
            codec.reconstruct_from(plan, &sources[..s], &mut outputs[..t], call.stores)
        }
        None if call.op.is_update() => {
            codec.update(middle_index(k), sources[0], sources[1], &mut outputs[..m])
        }
        None => codec.encode(&sources[..k], &mut outputs[..m], call.stores),
    }
}

/// What an ISA-L call needs besides the stripe.
struct IsalCall<'a> {
    isal: &'a Isal,
    function: IsalFunction,
    tables: &'a [u8],
    update_index: usize,
    data_chunks: usize,
    source_count: usize,
    output_count: usize,
}

fn run_isal(call: &IsalCall<'_>, prepared: &mut Prepared<'_>, scratch: &mut [u8]) {
    let Prepared { sources, outputs } = prepared;
    let (sources, outputs) = (&sources[..call.source_count], &mut outputs[..call.output_count]);
    match call.function {
        IsalFunction::XorGen => {
            call.isal.xor_gen(sources, outputs[0]);
        }
        IsalFunction::PqGen => {
            let (p, q) = outputs.split_at_mut(1);
            call.isal.pq_gen(sources, p[0], q[0]);
        }
        IsalFunction::EncodeData => call.isal.encode(call.tables, sources, outputs),
        IsalFunction::XorThenUpdate => {
            call.isal.xor_gen(&sources[..2], scratch);
            call.isal.encode_update(
                call.tables,
                call.data_chunks,
                call.update_index,
                scratch,
                outputs,
            );
        }
    }
}

/// The CPU's model name, for the report.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 { format!("{} MiB", bytes >> 20) } else { format!("{} KiB", bytes >> 10) }
}

/// The table header matching [`format_row`].
pub fn table_header() -> String {
    format!(
        "{:<15} {:>7} {:<4} {:>9} {:>9} {:>9} {:<36} {:>7} {:>9} {:>7}\n{}",
        "op",
        "chunk",
        "data",
        "flashraid",
        "nt-store",
        "ISA-L",
        "(best ISA-L function)",
        "vs ISAL",
        "mem read",
        "traffic",
        "-".repeat(121)
    )
}

/// One row as a table line (GB/s of data, ratios).
pub fn format_row(row: &Row) -> String {
    let best = row.isal.iter().max_by(|a, b| a.gbps.total_cmp(&b.gbps));
    let (isal_gbps, isal_name) = match best {
        Some(f) => (format!("{:.1}", f.gbps), format!("({} {})", f.version, f.function)),
        None => ("-".to_string(), "(no ISA-L loaded)".to_string()),
    };
    format!(
        "{:<15} {:>7} {:<4} {:>9.1} {:>9} {:>9} {:<36} {:>7} {:>9.1} {:>6.0}%",
        row.op.label(),
        size_label(row.chunk_bytes),
        match row.regime {
            Regime::Hot => "hot",
            Regime::Cold => "cold",
        },
        row.flashraid_gbps,
        row.flashraid_nontemporal_gbps.map_or("-".to_string(), |g| format!("{g:.1}")),
        isal_gbps,
        isal_name,
        row.ratio_to_isal.map_or("-".to_string(), |r| format!("{r:.2}x")),
        row.memory_read_gbps,
        row.traffic_fraction_of_read_bandwidth * 100.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_run_produces_sane_rows() {
        let config = Config {
            data_chunks: 4,
            chunk_sizes_bytes: vec![4096],
            regimes: vec![Regime::Hot, Regime::Cold],
            ops: Op::ALL.to_vec(),
            repetitions: 1,
            repetition_cpu: Duration::from_millis(2),
            cold_pool_bytes: 4 << 20,
            kernel: Kernel::best(),
            isal_paths: vec![],
            cpu: None,
        };
        let report = run(&config, |_| {}).unwrap();
        assert_eq!(report.rows.len(), 16);
        for row in &report.rows {
            assert!(row.flashraid_gbps > 0.0 && row.memory_read_gbps > 0.0, "{row:?}");
            assert!(row.ratio_to_isal.is_none());
            assert_eq!(row.flashraid_nontemporal_gbps.is_some(), !row.op.is_update());
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        let mut config = Config::quick(vec![]);
        config.chunk_sizes_bytes = vec![1000];
        assert!(matches!(run(&config, |_| {}), Err(BenchError::ChunkSize(1000))));
        let mut config = Config::quick(vec![]);
        config.data_chunks = 2;
        assert!(matches!(run(&config, |_| {}), Err(BenchError::DataChunks(2))));
    }
}
