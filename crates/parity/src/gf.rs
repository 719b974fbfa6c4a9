//! GF(2^8) arithmetic with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), generator {02}.
//!
//! Owns: the field tables (exp, log, full product table), inversion, and the two per-coefficient
//! encodings the SIMD kernels consume: an 8x8 bit matrix for GFNI `vgf2p8affineqb` and a pair of
//! 16-entry nibble tables for `pshufb`.
//!
//! Invariants: every table is computed at compile time by `const fn`, so there is no start-up
//! work and no global mutable state. `exp` is stored twice over (510 entries) so that
//! `exp[log a + log b]` never needs a modulo.
//!
//! This is the field of Linux md RAID 6, ZFS raidz, ISA-L and SnapRAID: the same polynomial makes
//! our P and Q byte-identical to md's.

/// The field polynomial, with the x^8 term.
pub const POLYNOMIAL: u16 = 0x11d;

/// Multiply by the generator {02}: shift left and reduce by the polynomial.
pub const fn mul2(a: u8) -> u8 {
    let shifted = (a as u16) << 1;
    if shifted & 0x100 != 0 { (shifted ^ POLYNOMIAL) as u8 } else { shifted as u8 }
}

/// Carry-less "Russian peasant" product; the definition everything else is checked against.
pub const fn mul_slow(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        a = mul2(a);
        b >>= 1;
    }
    product
}

const fn build_exp() -> [u8; 510] {
    let mut table = [0u8; 510];
    let mut value = 1u8;
    let mut i = 0;
    while i < 255 {
        table[i] = value;
        table[i + 255] = value;
        value = mul2(value);
        i += 1;
    }
    table
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        table[exp[i] as usize] = i as u8;
        i += 1;
    }
    table
}

/// `EXP[i] = {02}^i`, for i in 0..510 (two periods, see the module invariants).
pub static EXP: [u8; 510] = build_exp();
/// `LOG[a]` for a != 0; `LOG[0]` is meaningless and never read.
pub static LOG: [u8; 256] = build_log();

const fn build_mul_table() -> [[u8; 256]; 256] {
    let mut table = [[0u8; 256]; 256];
    let mut a = 0;
    while a < 256 {
        let mut b = 0;
        while b < 256 {
            table[a][b] = mul_slow(a as u8, b as u8);
            b += 1;
        }
        a += 1;
    }
    table
}

/// The full 64 KiB product table: used by the scalar reference kernel, which favours obvious
/// correctness over speed.
pub static MUL: [[u8; 256]; 256] = build_mul_table();

/// Product in the field.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[usize::from(LOG[usize::from(a)]) + usize::from(LOG[usize::from(b)])]
}

/// Multiplicative inverse. Panics on zero: asking for 1/0 is a broken invariant of the caller
/// (the matrix code only inverts pivots it has checked are non-zero).
#[inline]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "GF(2^8): zero has no inverse");
    EXP[255 - usize::from(LOG[usize::from(a)])]
}

/// `{02}^e` for any exponent (the generator has order 255).
#[inline]
pub fn pow2(e: usize) -> u8 {
    EXP[e % 255]
}

/// The GFNI affine matrix that multiplies every byte by `c`.
///
/// `vgf2p8affineqb(x, A)` computes output bit i as parity(A.byte[7 - i] & x). Multiplication by a
/// constant is GF(2)-linear, so row i collects, for each input bit j, bit i of `c * 2^j`.
pub const fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    let mut out_bit = 0;
    while out_bit < 8 {
        let mut row = 0u8;
        let mut in_bit = 0;
        while in_bit < 8 {
            if (mul_slow(c, 1 << in_bit) >> out_bit) & 1 != 0 {
                row |= 1 << in_bit;
            }
            in_bit += 1;
        }
        matrix |= (row as u64) << (8 * (7 - out_bit));
        out_bit += 1;
    }
    matrix
}

/// `pshufb` tables for multiplication by `c`: bytes 0..16 hold `c * n` for the low nibble n,
/// bytes 16..32 hold `c * (n << 4)` for the high nibble.
pub const fn nibble_tables(c: u8) -> [u8; 32] {
    let mut table = [0u8; 32];
    let mut n = 0;
    while n < 16 {
        table[n] = mul_slow(c, n as u8);
        table[16 + n] = mul_slow(c, (n as u8) << 4);
        n += 1;
    }
    table
}

/// Apply an affine matrix to one byte, exactly as the GFNI instruction does; lets the scalar
/// tests check the matrices without SIMD hardware.
pub const fn affine_apply(matrix: u64, x: u8) -> u8 {
    let mut out = 0u8;
    let mut out_bit = 0;
    while out_bit < 8 {
        let row = (matrix >> (8 * (7 - out_bit))) as u8;
        if (row & x).count_ones() & 1 == 1 {
            out |= 1 << out_bit;
        }
        out_bit += 1;
    }
    out
}

/// Invert a square matrix in place by Gauss-Jordan elimination. Returns `false` (and leaves
/// `matrix` unspecified) if it is singular. `n` is at most a few (the erasure count), so the
/// cubic cost is negligible; the matrix is row-major, `n * n` entries.
pub fn invert_matrix(matrix: &mut [u8], inverse: &mut [u8], n: usize) -> bool {
    assert_eq!(matrix.len(), n * n);
    assert_eq!(inverse.len(), n * n);
    inverse.fill(0);
    for i in 0..n {
        inverse[i * n + i] = 1;
    }
    for col in 0..n {
        let Some(pivot_row) = (col..n).find(|&row| matrix[row * n + col] != 0) else {
            return false;
        };
        if pivot_row != col {
            for c in 0..n {
                matrix.swap(pivot_row * n + c, col * n + c);
                inverse.swap(pivot_row * n + c, col * n + c);
            }
        }
        let scale = inv(matrix[col * n + col]);
        for c in 0..n {
            matrix[col * n + c] = mul(matrix[col * n + c], scale);
            inverse[col * n + c] = mul(inverse[col * n + c], scale);
        }
        for row in 0..n {
            let factor = matrix[row * n + col];
            if row == col || factor == 0 {
                continue;
            }
            for c in 0..n {
                matrix[row * n + c] ^= mul(factor, matrix[col * n + c]);
                inverse[row * n + c] ^= mul(factor, inverse[col * n + c]);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_agree_with_the_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let expected = mul_slow(a, b);
                assert_eq!(mul(a, b), expected, "{a} * {b}");
                assert_eq!(MUL[usize::from(a)][usize::from(b)], expected);
            }
        }
    }

    #[test]
    fn generator_has_order_255() {
        let mut seen = [false; 256];
        for i in 0..255 {
            let v = pow2(i);
            assert!(!seen[usize::from(v)], "{{02}}^{i} repeats");
            seen[usize::from(v)] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    fn inverse_is_inverse() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
        }
    }

    #[test]
    fn affine_and_nibble_encodings_multiply() {
        for c in 0..=255u8 {
            let matrix = affine_matrix(c);
            let tables = nibble_tables(c);
            for x in 0..=255u8 {
                let expected = mul_slow(c, x);
                assert_eq!(affine_apply(matrix, x), expected);
                let by_nibbles = tables[usize::from(x & 15)] ^ tables[16 + usize::from(x >> 4)];
                assert_eq!(by_nibbles, expected);
            }
        }
    }

    #[test]
    fn matrix_inversion_round_trips() {
        // A 3x3 Vandermonde matrix over distinct powers is invertible.
        let n = 3;
        let base = [1u8, 1, 1, 1, 2, 4, 1, 4, 16];
        let mut work = base;
        let mut inverse = [0u8; 9];
        assert!(invert_matrix(&mut work, &mut inverse, n));
        for i in 0..n {
            for j in 0..n {
                let mut sum = 0u8;
                for t in 0..n {
                    sum ^= mul(base[i * n + t], inverse[t * n + j]);
                }
                assert_eq!(sum, u8::from(i == j));
            }
        }
        let mut singular = [1u8, 1, 2, 2];
        let mut out = [0u8; 4];
        assert!(!invert_matrix(&mut singular, &mut out, 2));
    }
}
