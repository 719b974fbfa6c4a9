//! Intel ISA-L, loaded with `dlopen` at run time: an oracle for the parity tests and a baseline
//! for the parity benchmark. It is never on flashraid's data path.
//!
//! Owns: finding a `libisal.so.2` (Debian's, or a newer one unpacked beside it), resolving the
//! handful of functions we compare against, and safe wrappers that check every length and count
//! before crossing into C.
//!
//! Why dlopen rather than linking: the benchmark compares against the fastest ISA-L it can get,
//! and Debian 12 ships 2.30 (no GFNI) while Debian 13's 2.31 has GFNI paths; both can be loaded
//! side by side from their paths. The tests use whichever is installed (`libisal-dev`).
//!
//! Limits: x86_64 Linux; `pq_gen` and `xor_gen` use non-temporal loads and stores, so their
//! buffers must be 64-byte aligned (checked).

use std::ffi::{c_int, c_uchar, c_void};
use std::path::{Path, PathBuf};

/// Why ISA-L could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IsalError {
    #[error(
        "cannot load ISA-L from {path}: {source} (install it with: apt-get install libisal-dev)"
    )]
    Load { path: PathBuf, source: libloading::Error },
    #[error("ISA-L at {path} lacks symbol {symbol}: {source}")]
    Symbol { path: PathBuf, symbol: &'static str, source: libloading::Error },
    #[error("no ISA-L found in {searched:?} (install it with: apt-get install libisal-dev)")]
    NotFound { searched: Vec<PathBuf> },
}

type GenRsMatrix = unsafe extern "C" fn(a: *mut c_uchar, m: c_int, k: c_int);
type InitTables =
    unsafe extern "C" fn(k: c_int, rows: c_int, a: *mut c_uchar, tables: *mut c_uchar);
type EncodeData = unsafe extern "C" fn(
    len: c_int,
    k: c_int,
    rows: c_int,
    tables: *mut c_uchar,
    data: *mut *mut c_uchar,
    coding: *mut *mut c_uchar,
);
type EncodeDataUpdate = unsafe extern "C" fn(
    len: c_int,
    k: c_int,
    rows: c_int,
    vec_i: c_int,
    tables: *mut c_uchar,
    data: *mut c_uchar,
    coding: *mut *mut c_uchar,
);
type InvertMatrix =
    unsafe extern "C" fn(input: *mut c_uchar, output: *mut c_uchar, n: c_int) -> c_int;
type RaidGen = unsafe extern "C" fn(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;

/// Most vectors any wrapper passes in one call (255 data + 3 parity).
pub const VECTORS_MAX: usize = 258;

/// A loaded ISA-L.
#[derive(Debug)]
pub struct Isal {
    path: PathBuf,
    version: String,
    gen_rs_matrix: GenRsMatrix,
    init_tables: InitTables,
    encode_data: EncodeData,
    encode_data_update: EncodeDataUpdate,
    invert_matrix: InvertMatrix,
    pq_gen: RaidGen,
    xor_gen: RaidGen,
    // Keeps the function pointers above valid; dropped last.
    _library: libloading::Library,
}

/// Where Debian and most distributions put the runtime library.
pub const SYSTEM_PATHS: [&str; 3] =
    ["/usr/lib/x86_64-linux-gnu/libisal.so.2", "/usr/lib64/libisal.so.2", "/usr/lib/libisal.so.2"];

fn version_from_path(path: &Path) -> String {
    // libisal.so.2 -> libisal.so.2.0.31: the file name carries the release.
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = resolved.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.strip_prefix("libisal.so.2.0.") {
        Some(minor) => format!("2.{minor}"),
        None => format!("unknown ({name})"),
    }
}

impl Isal {
    /// Load the system's ISA-L (Debian's `libisal2`).
    pub fn load_system() -> Result<Self, IsalError> {
        let searched: Vec<PathBuf> = SYSTEM_PATHS.iter().map(PathBuf::from).collect();
        match searched.iter().find(|p| p.exists()) {
            Some(path) => Self::load(path),
            None => Err(IsalError::NotFound { searched }),
        }
    }

    /// Load ISA-L from a given file.
    pub fn load(path: &Path) -> Result<Self, IsalError> {
        // SAFETY: loading runs the library's initialisers; ISA-L's only set up its dispatch
        // tables and have no other side effects.
        let loaded = unsafe { libloading::Library::new(path) };
        let library =
            loaded.map_err(|source| IsalError::Load { path: path.to_path_buf(), source })?;
        macro_rules! symbol {
            ($name:literal, $ty:ty) => {{
                // SAFETY: the type matches the prototype in ISA-L's public headers
                // (erasure_code.h, raid.h), unchanged since 2.x.
                let found = unsafe { library.get::<$ty>($name) };
                let symbol: libloading::Symbol<'_, $ty> =
                    found.map_err(|source| IsalError::Symbol {
                        path: path.to_path_buf(),
                        symbol: std::str::from_utf8(&$name[..$name.len() - 1]).unwrap_or("?"),
                        source,
                    })?;
                *symbol
            }};
        }
        Ok(Self {
            path: path.to_path_buf(),
            version: version_from_path(path),
            gen_rs_matrix: symbol!(b"gf_gen_rs_matrix\0", GenRsMatrix),
            init_tables: symbol!(b"ec_init_tables\0", InitTables),
            encode_data: symbol!(b"ec_encode_data\0", EncodeData),
            encode_data_update: symbol!(b"ec_encode_data_update\0", EncodeDataUpdate),
            invert_matrix: symbol!(b"gf_invert_matrix\0", InvertMatrix),
            pq_gen: symbol!(b"pq_gen\0", RaidGen),
            xor_gen: symbol!(b"xor_gen\0", RaidGen),
            _library: library,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The release, read from the library's file name (e.g. "2.31").
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `gf_gen_rs_matrix(a, total, k)`: a `total x k` matrix, identity on top, then rows
    /// `(2^r)^j`.
    pub fn gen_rs_matrix(&self, total_rows: usize, data_columns: usize) -> Vec<u8> {
        assert!(total_rows <= VECTORS_MAX && data_columns <= 255 && data_columns <= total_rows);
        let mut matrix = vec![0u8; total_rows * data_columns];
        // SAFETY: the buffer holds total_rows * data_columns bytes, which is what it writes.
        unsafe {
            (self.gen_rs_matrix)(matrix.as_mut_ptr(), to_int(total_rows), to_int(data_columns))
        };
        matrix
    }

    /// `gf_invert_matrix` of an `n x n` matrix; `None` if singular.
    pub fn invert_matrix(&self, matrix: &[u8], n: usize) -> Option<Vec<u8>> {
        assert_eq!(matrix.len(), n * n);
        let mut input = matrix.to_vec();
        let mut output = vec![0u8; n * n];
        // SAFETY: both buffers hold n * n bytes; ISA-L writes only within them.
        let status =
            unsafe { (self.invert_matrix)(input.as_mut_ptr(), output.as_mut_ptr(), to_int(n)) };
        (status == 0).then_some(output)
    }

    /// `ec_init_tables` for a `rows x k` coefficient matrix; returns the expanded tables
    /// (32 bytes per coefficient, enough for every dispatch level).
    pub fn init_tables(&self, data_columns: usize, rows: usize, coefficients: &[u8]) -> Vec<u8> {
        assert_eq!(coefficients.len(), rows * data_columns);
        let mut matrix = coefficients.to_vec();
        let mut tables = vec![0u8; 32 * rows * data_columns];
        // SAFETY: the matrix has rows * k entries and the tables 32 bytes for each.
        unsafe {
            (self.init_tables)(
                to_int(data_columns),
                to_int(rows),
                matrix.as_mut_ptr(),
                tables.as_mut_ptr(),
            )
        };
        tables
    }

    /// `ec_encode_data`: `outputs[r] = sum_j coef(r, j) * sources[j]`.
    pub fn encode(&self, tables: &[u8], sources: &[&[u8]], outputs: &mut [&mut [u8]]) {
        let len = sources[0].len();
        assert!(sources.iter().all(|s| s.len() == len) && outputs.iter().all(|o| o.len() == len));
        assert!(sources.len() + outputs.len() <= VECTORS_MAX);
        assert_eq!(tables.len(), 32 * sources.len() * outputs.len());
        let mut srcs = [std::ptr::null_mut::<c_uchar>(); VECTORS_MAX];
        for (slot, s) in srcs.iter_mut().zip(sources) {
            // ISA-L's prototype is not const-correct; it only reads sources.
            *slot = s.as_ptr().cast_mut();
        }
        let mut outs = [std::ptr::null_mut::<c_uchar>(); VECTORS_MAX];
        for (slot, o) in outs.iter_mut().zip(outputs.iter_mut()) {
            *slot = o.as_mut_ptr();
        }
        // SAFETY: every pointer is valid for `len` bytes; tables match rows x k; ISA-L only
        // reads the sources and tables.
        unsafe {
            (self.encode_data)(
                to_int(len),
                to_int(sources.len()),
                to_int(outputs.len()),
                tables.as_ptr().cast_mut(),
                srcs.as_mut_ptr(),
                outs.as_mut_ptr(),
            )
        };
    }

    /// `ec_encode_data_update`: `outputs[r] ^= coef(r, source_index) * source`.
    pub fn encode_update(
        &self,
        tables: &[u8],
        data_columns: usize,
        source_index: usize,
        source: &[u8],
        outputs: &mut [&mut [u8]],
    ) {
        let len = source.len();
        assert!(outputs.iter().all(|o| o.len() == len) && source_index < data_columns);
        assert!(outputs.len() <= VECTORS_MAX);
        assert_eq!(tables.len(), 32 * data_columns * outputs.len());
        let mut outs = [std::ptr::null_mut::<c_uchar>(); VECTORS_MAX];
        for (slot, o) in outs.iter_mut().zip(outputs.iter_mut()) {
            *slot = o.as_mut_ptr();
        }
        // SAFETY: as in `encode`; ISA-L reads `source` and the tables only.
        unsafe {
            (self.encode_data_update)(
                to_int(len),
                to_int(data_columns),
                to_int(outputs.len()),
                to_int(source_index),
                tables.as_ptr().cast_mut(),
                source.as_ptr().cast_mut(),
                outs.as_mut_ptr(),
            )
        };
    }

    fn raid_gen(&self, function: RaidGen, sources: &[&[u8]], outputs: &mut [&mut [u8]]) -> bool {
        let len = sources[0].len();
        assert!(sources.iter().all(|s| s.len() == len) && outputs.iter().all(|o| o.len() == len));
        assert!(sources.len() + outputs.len() <= VECTORS_MAX);
        let aligned = sources.iter().all(|s| (s.as_ptr() as usize).is_multiple_of(64))
            && outputs.iter().all(|o| (o.as_ptr() as usize).is_multiple_of(64));
        assert!(aligned, "ISA-L's raid functions use non-temporal access: 64-byte alignment");
        let mut array = [std::ptr::null_mut::<c_void>(); VECTORS_MAX];
        let mut count = 0;
        for s in sources {
            array[count] = s.as_ptr().cast_mut().cast();
            count += 1;
        }
        for o in outputs.iter_mut() {
            array[count] = o.as_mut_ptr().cast();
            count += 1;
        }
        // SAFETY: every pointer is valid for `len` bytes and 64-byte aligned; the function
        // writes only the trailing output vectors.
        unsafe { function(to_int(count), to_int(len), array.as_mut_ptr()) == 0 }
    }

    /// `pq_gen`: P and Q of the sources (Linux md's layout). Returns false if ISA-L refused.
    pub fn pq_gen(&self, sources: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> bool {
        self.raid_gen(self.pq_gen, sources, &mut [p, q])
    }

    /// `xor_gen`: P of the sources. Returns false if ISA-L refused.
    pub fn xor_gen(&self, sources: &[&[u8]], p: &mut [u8]) -> bool {
        self.raid_gen(self.xor_gen, sources, &mut [p])
    }
}

fn to_int(value: usize) -> c_int {
    c_int::try_from(value).expect("ISA-L takes int sizes; callers pass small values")
}
