//! ISA-L as an independent oracle: its Reed-Solomon matrix rows are exactly our P/Q/R, its
//! encode and md-layout `pq_gen` produce our bytes, and its own matrix inversion recovers the
//! same data our plans do. Needs `libisal-dev` (the README's test command installs it); a
//! missing ISA-L fails these tests rather than skipping them.

mod common;

use common::Buffer;
use flashraid_isal::Isal;
use flashraid_parity::{Codec, Kernel, Stores, coefficient};

fn isal() -> Isal {
    Isal::load_system().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn rs_matrix_rows_are_p_q_r() {
    let isal = isal();
    for k in [2usize, 10, 100, 255] {
        let total = k + 3;
        let matrix = isal.gen_rs_matrix(total, k);
        for row in 0..3 {
            for j in 0..k {
                assert_eq!(
                    matrix[(k + row) * k + j],
                    coefficient(row, j),
                    "row {row} col {j} k {k}"
                );
            }
        }
    }
}

#[test]
fn encode_matches_isal_encode_and_pq_gen() {
    let isal = isal();
    let mut rng = common::seed("encode_matches_isal_encode_and_pq_gen", 17);
    for (k, len) in [(2usize, 512usize), (10, 16384), (24, 4096), (255, 1024)] {
        // 64-byte aligned: pq_gen and xor_gen use non-temporal access.
        let data: Vec<Buffer> = (0..k).map(|_| Buffer::random(len, 0, &mut rng)).collect();
        let sources: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
        let matrix = isal.gen_rs_matrix(k + 3, k);
        let tables = isal.init_tables(k, 3, &matrix[k * k..]);
        let mut expected = vec![vec![0u8; len]; 3];
        {
            let mut outs: Vec<&mut [u8]> = expected.iter_mut().map(|e| e.as_mut_slice()).collect();
            isal.encode(&tables, &sources, &mut outs);
        }
        let mut p = Buffer::new(len, 0);
        let mut q = Buffer::new(len, 0);
        assert!(isal.pq_gen(&sources, p.as_mut(), q.as_mut()));
        assert_eq!(p.as_ref(), expected[0].as_slice(), "pq_gen P vs ec_encode_data");
        assert_eq!(q.as_ref(), expected[1].as_slice(), "pq_gen Q vs ec_encode_data");
        let mut x = Buffer::new(len, 0);
        assert!(isal.xor_gen(&sources, x.as_mut()));
        assert_eq!(x.as_ref(), expected[0].as_slice());
        for kernel in Kernel::supported() {
            for m in 1..=3 {
                let codec = Codec::with_kernel(k, m, kernel).unwrap();
                let mut parity = vec![vec![0u8; len]; m];
                let mut outs: Vec<&mut [u8]> =
                    parity.iter_mut().map(|p| p.as_mut_slice()).collect();
                codec.encode(&sources, &mut outs, Stores::Cached).unwrap();
                assert!(parity[..] == expected[..m], "{kernel} k={k} m={m} differs from ISA-L");
            }
        }
    }
}

#[test]
fn update_matches_isal_update() {
    let isal = isal();
    let mut rng = common::seed("update_matches_isal_update", 19);
    let (k, len) = (10usize, 8192usize);
    let data: Vec<Buffer> = (0..k).map(|_| Buffer::random(len, 0, &mut rng)).collect();
    let new = Buffer::random(len, 0, &mut rng);
    let sources: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
    let matrix = isal.gen_rs_matrix(k + 3, k);
    let tables = isal.init_tables(k, 3, &matrix[k * k..]);
    let mut base = vec![vec![0u8; len]; 3];
    {
        let mut outs: Vec<&mut [u8]> = base.iter_mut().map(|e| e.as_mut_slice()).collect();
        isal.encode(&tables, &sources, &mut outs);
    }
    let index = 6;
    // ISA-L's incremental update adds coef * source; an RMW adds coef * (old ^ new).
    let delta: Vec<u8> =
        data[index].as_ref().iter().zip(new.as_ref()).map(|(a, b)| a ^ b).collect();
    let mut expected = base.clone();
    {
        let mut outs: Vec<&mut [u8]> = expected.iter_mut().map(|e| e.as_mut_slice()).collect();
        isal.encode_update(&tables, k, index, &delta, &mut outs);
    }
    for kernel in Kernel::supported() {
        let codec = Codec::with_kernel(k, 3, kernel).unwrap();
        let mut parity = base.clone();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.update(index, data[index].as_ref(), new.as_ref(), &mut outs).unwrap();
        assert!(parity == expected, "{kernel} update differs from ISA-L");
    }
}

#[test]
fn decode_matches_isal_inversion() {
    // ISA-L's way: take the first k surviving rows of the generator, invert, and multiply.
    let isal = isal();
    let mut rng = common::seed("decode_matches_isal_inversion", 23);
    let (k, m, len) = (10usize, 3usize, 4096usize);
    let data: Vec<Buffer> = (0..k).map(|_| Buffer::random(len, 0, &mut rng)).collect();
    let sources: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
    let generator = isal.gen_rs_matrix(k + m, k);
    let mut chunks: Vec<Vec<u8>> = sources.iter().map(|s| s.to_vec()).collect();
    {
        let tables = isal.init_tables(k, m, &generator[k * k..]);
        let mut parity = vec![vec![0u8; len]; m];
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        isal.encode(&tables, &sources, &mut outs);
        chunks.extend(parity);
    }
    for erased in [vec![4usize], vec![0, 4], vec![0, 4, 9], vec![3, k], vec![1, k + 1, k + 2]] {
        let survivors: Vec<usize> = (0..k + m).filter(|c| !erased.contains(c)).take(k).collect();
        let mut square = vec![0u8; k * k];
        for (i, &row) in survivors.iter().enumerate() {
            square[i * k..(i + 1) * k].copy_from_slice(&generator[row * k..(row + 1) * k]);
        }
        let inverse = isal.invert_matrix(&square, k).expect("survivor matrix invertible");
        let lost_data: Vec<usize> = erased.iter().copied().filter(|&e| e < k).collect();
        let rows: Vec<u8> =
            lost_data.iter().flat_map(|&x| inverse[x * k..(x + 1) * k].to_vec()).collect();
        let survivor_refs: Vec<&[u8]> = survivors.iter().map(|&s| chunks[s].as_slice()).collect();
        let mut isal_out = vec![vec![0u8; len]; lost_data.len()];
        if !lost_data.is_empty() {
            let tables = isal.init_tables(k, lost_data.len(), &rows);
            let mut outs: Vec<&mut [u8]> = isal_out.iter_mut().map(|o| o.as_mut_slice()).collect();
            isal.encode(&tables, &survivor_refs, &mut outs);
        }
        for kernel in Kernel::supported() {
            let codec = Codec::with_kernel(k, m, kernel).unwrap();
            let plan = codec.plan_reconstruct(&erased, &lost_data).unwrap();
            let mut work = chunks.clone();
            for &e in &erased {
                work[e].fill(0);
            }
            let mut stripe: Vec<&mut [u8]> = work.iter_mut().map(|c| c.as_mut_slice()).collect();
            codec.reconstruct(&plan, &mut stripe, Stores::Cached).unwrap();
            for (i, &x) in lost_data.iter().enumerate() {
                assert_eq!(work[x], isal_out[i], "{kernel} erased {erased:?} chunk {x}");
                assert_eq!(work[x], chunks[x]);
            }
        }
    }
}
