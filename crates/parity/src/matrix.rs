//! The parity code's generator rows and the decode plans derived from them.
//!
//! Owns: the coefficient of every (parity row, data position) pair, the static encode tables the
//! kernels read (GF byte, GFNI matrix and `pshufb` nibble tables for each coefficient), and the
//! algebra that turns an erasure pattern into one dot product over the survivors.
//!
//! The code: parity row r has coefficient (2^r)^j for data position j, so P = XOR, Q = sum of
//! 2^j D_j (Linux md RAID 6), R = sum of 4^j D_j (ZFS raidz3's generator). This is MDS for every
//! k <= 255 with up to three rows (the exhaustive minor check in the tests proves it); a fourth
//! Vandermonde row 8^j is not MDS from k = 22 on, so more parity rows will need Cauchy-derived
//! rows appended after P and Q. Everything that names a row goes through `coefficient`, which is
//! the one place such a change lands.
//!
//! Invariants: a plan's rows are exact (checked against the generator in tests); plans are built
//! once per erasure pattern and reused, never per stripe.

use crate::gf;
use crate::{DATA_CHUNKS_MAX, PARITY_CHUNKS_MAX, ParityError};

/// Coefficient of data position `data_index` in parity row `parity_row`.
#[inline]
pub fn coefficient(parity_row: usize, data_index: usize) -> u8 {
    debug_assert!(parity_row < PARITY_CHUNKS_MAX && data_index < DATA_CHUNKS_MAX);
    gf::pow2(parity_row * data_index)
}

/// Per-coefficient encodings of a rows x columns coefficient matrix, row-major with `stride`.
/// The kernels read the encoding they need: scalar the byte, GFNI the matrix, `pshufb` the
/// nibble tables.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Coefficients<'a> {
    pub gf: &'a [u8],
    pub affine: &'a [u64],
    pub nibbles: &'a [[u8; 32]],
    pub stride: usize,
}

impl Coefficients<'_> {
    #[inline(always)]
    pub fn index(&self, row: usize, column: usize) -> usize {
        row * self.stride + column
    }
}

const ENCODE_STRIDE: usize = DATA_CHUNKS_MAX;
const ENCODE_ENTRIES: usize = PARITY_CHUNKS_MAX * ENCODE_STRIDE;

const fn encode_gf() -> [u8; ENCODE_ENTRIES] {
    let mut table = [0u8; ENCODE_ENTRIES];
    let mut row = 0;
    while row < PARITY_CHUNKS_MAX {
        // (2^row)^j, built by repeated multiplication so it stays a const fn.
        let base = gf::mul_slow(1, 1 << row);
        let mut value = 1u8;
        let mut j = 0;
        while j < ENCODE_STRIDE {
            table[row * ENCODE_STRIDE + j] = value;
            value = gf::mul_slow(value, base);
            j += 1;
        }
        row += 1;
    }
    table
}

const fn encode_affine(gf_table: &[u8; ENCODE_ENTRIES]) -> [u64; ENCODE_ENTRIES] {
    let mut table = [0u64; ENCODE_ENTRIES];
    let mut i = 0;
    while i < ENCODE_ENTRIES {
        table[i] = gf::affine_matrix(gf_table[i]);
        i += 1;
    }
    table
}

const fn encode_nibbles(gf_table: &[u8; ENCODE_ENTRIES]) -> [[u8; 32]; ENCODE_ENTRIES] {
    let mut table = [[0u8; 32]; ENCODE_ENTRIES];
    let mut i = 0;
    while i < ENCODE_ENTRIES {
        table[i] = gf::nibble_tables(gf_table[i]);
        i += 1;
    }
    table
}

static ENCODE_GF: [u8; ENCODE_ENTRIES] = encode_gf();
static ENCODE_AFFINE: [u64; ENCODE_ENTRIES] = encode_affine(&encode_gf());
static ENCODE_NIBBLES: [[u8; 32]; ENCODE_ENTRIES] = encode_nibbles(&encode_gf());

/// The encode coefficients of every parity row for every data position.
pub(crate) fn encode_coefficients() -> Coefficients<'static> {
    Coefficients {
        gf: &ENCODE_GF,
        affine: &ENCODE_AFFINE,
        nibbles: &ENCODE_NIBBLES,
        stride: ENCODE_STRIDE,
    }
}

/// How to rebuild a set of chunks of a stripe from its survivors: one pass that reads `sources`
/// and writes `targets`, each target a GF dot product of the sources.
///
/// Chunk indices: `0..data_chunks` are data positions, `data_chunks + r` is parity row r.
/// Build one per erasure pattern with [`crate::Codec::plan_reconstruct`] and keep it: building
/// costs a small matrix inversion and a few allocations, running it costs neither.
#[derive(Clone, Debug)]
pub struct ReconstructPlan {
    pub(crate) data_chunks: usize,
    pub(crate) parity_chunks: usize,
    pub(crate) sources: Vec<usize>,
    pub(crate) targets: Vec<usize>,
    /// Row 0 has every coefficient equal to 1 (it is plain XOR, e.g. one data chunk from P).
    pub(crate) first_row_xor: bool,
    pub(crate) gf: Vec<u8>,
    pub(crate) affine: Vec<u64>,
    pub(crate) nibbles: Vec<[u8; 32]>,
}

impl ReconstructPlan {
    /// Chunks the plan reads, in the order the kernel consumes them.
    pub fn sources(&self) -> &[usize] {
        &self.sources
    }

    /// Chunks the plan writes.
    pub fn targets(&self) -> &[usize] {
        &self.targets
    }

    /// Coefficient of `sources()[source]` in the expression for `targets()[target]`.
    pub fn coefficient(&self, target: usize, source: usize) -> u8 {
        self.gf[target * self.sources.len() + source]
    }

    pub(crate) fn coefficients(&self) -> Coefficients<'_> {
        Coefficients {
            gf: &self.gf,
            affine: &self.affine,
            nibbles: &self.nibbles,
            stride: self.sources.len(),
        }
    }

    /// Build the plan. `erased` lists every chunk whose contents are unknown (at most
    /// `parity_chunks`); `targets` is the subset to rebuild (the others are neither read nor
    /// written).
    pub(crate) fn build(
        data_chunks: usize,
        parity_chunks: usize,
        erased: &[usize],
        targets: &[usize],
    ) -> Result<Self, ParityError> {
        let chunks = data_chunks + parity_chunks;
        let mut is_erased = [false; DATA_CHUNKS_MAX + PARITY_CHUNKS_MAX];
        for &chunk in erased {
            if chunk >= chunks {
                return Err(ParityError::ChunkIndexOutOfRange { index: chunk, chunks });
            }
            if is_erased[chunk] {
                return Err(ParityError::DuplicateChunkIndex { index: chunk });
            }
            is_erased[chunk] = true;
        }
        if erased.len() > parity_chunks {
            return Err(ParityError::TooManyErasures { erased: erased.len(), parity_chunks });
        }
        let mut is_target = [false; DATA_CHUNKS_MAX + PARITY_CHUNKS_MAX];
        for &chunk in targets {
            if chunk >= chunks || !is_erased[chunk] {
                return Err(ParityError::TargetNotErased { index: chunk });
            }
            if is_target[chunk] {
                return Err(ParityError::DuplicateChunkIndex { index: chunk });
            }
            is_target[chunk] = true;
        }

        let lost_data: Vec<usize> = (0..data_chunks).filter(|&j| is_erased[j]).collect();
        // Solve the lost data from the first surviving parity rows: P first, so one lost data
        // chunk with P alive is plain XOR, as in RAID 5.
        let used_rows: Vec<usize> = (0..parity_chunks)
            .filter(|&r| !is_erased[data_chunks + r])
            .take(lost_data.len())
            .collect();
        assert_eq!(used_rows.len(), lost_data.len(), "erasure count was checked above");
        let surviving_data: Vec<usize> = (0..data_chunks).filter(|&j| !is_erased[j]).collect();

        let mut sources = surviving_data.clone();
        sources.extend(used_rows.iter().map(|&r| data_chunks + r));

        // Each lost data chunk as a combination of the sources: D_L = A^-1 (Par_used + B D_surv)
        // where A = G[used][lost], B = G[used][surviving].
        let lost_count = lost_data.len();
        let mut a = vec![0u8; lost_count * lost_count];
        for (i, &row) in used_rows.iter().enumerate() {
            for (t, &x) in lost_data.iter().enumerate() {
                a[i * lost_count + t] = coefficient(row, x);
            }
        }
        let mut a_inv = vec![0u8; lost_count * lost_count];
        let invertible = gf::invert_matrix(&mut a, &mut a_inv, lost_count);
        // The code is MDS (proved exhaustively in the tests), so this cannot fail.
        assert!(invertible, "parity submatrix singular: the code is not MDS for this pattern");

        // lost_rows[t][s]: coefficient of source s in lost data chunk lost_data[t].
        let source_count = sources.len();
        let mut lost_rows = vec![0u8; lost_count * source_count];
        for t in 0..lost_count {
            for (i, &row) in used_rows.iter().enumerate() {
                let weight = a_inv[t * lost_count + i];
                // The parity chunk itself.
                lost_rows[t * source_count + surviving_data.len() + i] ^= weight;
                // And the surviving data it covers.
                for (s, &j) in surviving_data.iter().enumerate() {
                    lost_rows[t * source_count + s] ^= gf::mul(weight, coefficient(row, j));
                }
            }
        }

        let mut target_rows: Vec<(usize, Vec<u8>)> = Vec::with_capacity(targets.len());
        for &target in targets {
            let row = if target < data_chunks {
                let t = lost_data.iter().position(|&x| x == target).expect("target is lost");
                lost_rows[t * source_count..(t + 1) * source_count].to_vec()
            } else {
                // A lost parity chunk: its row over all data, with lost data substituted.
                let parity_row = target - data_chunks;
                let mut row = vec![0u8; source_count];
                for (s, &j) in surviving_data.iter().enumerate() {
                    row[s] = coefficient(parity_row, j);
                }
                for (t, &x) in lost_data.iter().enumerate() {
                    let weight = coefficient(parity_row, x);
                    for s in 0..source_count {
                        row[s] ^= gf::mul(weight, lost_rows[t * source_count + s]);
                    }
                }
                row
            };
            target_rows.push((target, row));
        }
        // Put an all-ones row first: the kernels then run it as plain XOR.
        let first_row_xor =
            match target_rows.iter().position(|(_, row)| row.iter().all(|&c| c == 1)) {
                Some(position) => {
                    target_rows.swap(0, position);
                    true
                }
                None => false,
            };

        // Sources are survivors and targets are erased: disjoint, which the kernels rely on.
        assert!(target_rows.iter().all(|(target, _)| !sources.contains(target)));
        let gf_flat: Vec<u8> =
            target_rows.iter().flat_map(|(_, row)| row.iter().copied()).collect();
        Ok(Self {
            data_chunks,
            parity_chunks,
            affine: gf_flat.iter().map(|&c| gf::affine_matrix(c)).collect(),
            nibbles: gf_flat.iter().map(|&c| gf::nibble_tables(c)).collect(),
            gf: gf_flat,
            targets: target_rows.iter().map(|(target, _)| *target).collect(),
            sources,
            first_row_xor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_tables_match_coefficients() {
        let coefs = encode_coefficients();
        for row in 0..PARITY_CHUNKS_MAX {
            for j in 0..DATA_CHUNKS_MAX {
                let c = coefficient(row, j);
                let i = coefs.index(row, j);
                assert_eq!(coefs.gf[i], c);
                assert_eq!(coefs.affine[i], gf::affine_matrix(c));
                assert_eq!(coefs.nibbles[i], gf::nibble_tables(c));
            }
        }
        assert!((0..DATA_CHUNKS_MAX).all(|j| coefficient(0, j) == 1));
        assert_eq!(coefficient(1, 1), 2);
        assert_eq!(coefficient(2, 1), 4);
        assert_eq!(coefficient(1, 8), 0x1d);
    }

    fn det2(a: u8, b: u8, c: u8, d: u8) -> u8 {
        gf::mul(a, d) ^ gf::mul(b, c)
    }

    /// MDS proof for P, Q, R over every k <= 255: a systematic code with parity matrix H is MDS
    /// iff every square submatrix of H is non-singular. Columns of the k = 255 matrix contain
    /// those of every smaller k, so checking all minors of the 3 x 255 matrix proves all k.
    #[test]
    fn pqr_is_mds_for_every_k_up_to_255() {
        let n = DATA_CHUNKS_MAX;
        let c = |r: usize, j: usize| coefficient(r, j);
        for r in 0..3 {
            for j in 0..n {
                assert_ne!(c(r, j), 0);
            }
        }
        for (r0, r1) in [(0, 1), (0, 2), (1, 2)] {
            for j0 in 0..n {
                for j1 in j0 + 1..n {
                    assert_ne!(det2(c(r0, j0), c(r0, j1), c(r1, j0), c(r1, j1)), 0, "{j0},{j1}");
                }
            }
        }
        for j0 in 0..n {
            for j1 in j0 + 1..n {
                // Cofactors along the first row are shared by every j2.
                let m12 = det2(c(1, j0), c(1, j1), c(2, j0), c(2, j1));
                for j2 in j1 + 1..n {
                    let m = [
                        [c(0, j0), c(0, j1), c(0, j2)],
                        [c(1, j0), c(1, j1), c(1, j2)],
                        [c(2, j0), c(2, j1), c(2, j2)],
                    ];
                    let det = gf::mul(m[0][0], det2(m[1][1], m[1][2], m[2][1], m[2][2]))
                        ^ gf::mul(m[0][1], det2(m[1][0], m[1][2], m[2][0], m[2][2]))
                        ^ gf::mul(m[0][2], m12);
                    assert_ne!(det, 0, "columns {j0},{j1},{j2}");
                }
            }
        }
    }

    /// Whether any square submatrix of `rows` x `0..k` that uses column `k - 1` is singular.
    fn new_column_breaks_mds(rows: &[Vec<u8>], k: usize) -> bool {
        let last = k - 1;
        let row_count = rows.len();
        for size in 1..=row_count.min(k) {
            // Every choice of `size` rows and `size - 1` earlier columns, plus the last column.
            for row_mask in 0u32..(1 << row_count) {
                if row_mask.count_ones() as usize != size {
                    continue;
                }
                let chosen_rows: Vec<usize> =
                    (0..row_count).filter(|r| row_mask & (1 << r) != 0).collect();
                let mut columns = vec![0usize; size];
                columns[size - 1] = last;
                if subsets_singular(rows, &chosen_rows, &mut columns, 0, 0, last) {
                    return true;
                }
            }
        }
        false
    }

    fn subsets_singular(
        rows: &[Vec<u8>],
        chosen_rows: &[usize],
        columns: &mut [usize],
        depth: usize,
        from: usize,
        last: usize,
    ) -> bool {
        let size = chosen_rows.len();
        if depth == size - 1 {
            let mut m = vec![0u8; size * size];
            for (i, &r) in chosen_rows.iter().enumerate() {
                for (t, &j) in columns.iter().enumerate() {
                    m[i * size + t] = rows[r][j];
                }
            }
            let mut inverse = vec![0u8; size * size];
            return !gf::invert_matrix(&mut m, &mut inverse, size);
        }
        for j in from..last {
            columns[depth] = j;
            if subsets_singular(rows, chosen_rows, columns, depth + 1, j + 1, last) {
                return true;
            }
        }
        false
    }

    #[test]
    fn a_fourth_vandermonde_row_is_not_mds_from_k_22() {
        // Why rows beyond R must be Cauchy-derived: appending 8^j breaks MDS at k = 22, which
        // matches the limit in ISA-L's header and Ceph's ISA plugin.
        let rows: Vec<Vec<u8>> =
            (0..4).map(|r| (0..32).map(|j| gf::pow2(r * j)).collect()).collect();
        let first_failure = (1..=32).find(|&k| new_column_breaks_mds(&rows, k));
        assert_eq!(first_failure, Some(22));
        let three: Vec<Vec<u8>> = rows[..3].to_vec();
        assert_eq!((1..=32).find(|&k| new_column_breaks_mds(&three, k)), None);
    }
}
