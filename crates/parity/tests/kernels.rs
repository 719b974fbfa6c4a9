//! Differential tests: every SIMD kernel produces exactly the scalar reference's bytes, for
//! random stripe widths, chunk lengths, buffer misalignments and store modes; and the reference
//! itself equals the definition and Linux md's syndrome.

mod common;

use common::{Buffer, definition_parity, md_gen_syndrome};
use flashraid_parity::{Codec, Kernel, Stores};
use proptest::prelude::*;

fn kernels() -> Vec<Kernel> {
    let supported = Kernel::supported();
    // On the reference machine (x86_64 with AVX-512 and GFNI) every kernel must be exercised;
    // a CI runner that silently lacks them would make these tests vacuous, so say so loudly.
    if std::env::var_os("FLASHRAID_REQUIRE_ALL_KERNELS").is_some() {
        assert_eq!(supported, Kernel::ALL.to_vec(), "this CPU cannot run every kernel");
    }
    supported
}

#[derive(Debug, Clone)]
struct Shape {
    data_chunks: usize,
    parity_chunks: usize,
    len: usize,
    misalign: Vec<usize>,
    nontemporal: bool,
    seed: u64,
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop_oneof![2usize..=12, 13usize..=255],
        1usize..=3,
        prop_oneof![1usize..=8, 9usize..=130],
        any::<bool>(),
        any::<u64>(),
    )
        .prop_flat_map(|(k, m, blocks, nontemporal, seed)| {
            let misalign = prop::collection::vec(prop_oneof![Just(0usize), 0usize..64], k + m);
            (Just(k), Just(m), Just(blocks * 512), misalign, Just(nontemporal), Just(seed))
        })
        .prop_map(|(data_chunks, parity_chunks, len, misalign, nontemporal, seed)| Shape {
            data_chunks,
            parity_chunks,
            len,
            misalign,
            nontemporal,
            seed,
        })
}

fn stripe(shape: &Shape) -> Vec<Buffer> {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(shape.seed);
    (0..shape.data_chunks).map(|j| Buffer::random(shape.len, shape.misalign[j], &mut rng)).collect()
}

fn encode_with(kernel: Kernel, shape: &Shape, data: &[Buffer]) -> Vec<Vec<u8>> {
    let codec = Codec::with_kernel(shape.data_chunks, shape.parity_chunks, kernel).unwrap();
    let sources: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
    // Poisoned outputs: a kernel that skips a block would leave 0xA5 behind.
    let mut parity: Vec<Buffer> = (0..shape.parity_chunks)
        .map(|r| Buffer::filled(shape.len, shape.misalign[shape.data_chunks + r], 0xa5))
        .collect();
    let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|b| b.as_mut()).collect();
    let stores = if shape.nontemporal { Stores::NonTemporal } else { Stores::Cached };
    codec.encode(&sources, &mut outs, stores).unwrap();
    parity.iter().map(|b| b.as_ref().to_vec()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_kernel_encodes_like_the_reference(shape in shape()) {
        let data = stripe(&shape);
        let reference = encode_with(Kernel::Scalar, &shape, &data);
        for kernel in kernels() {
            let parity = encode_with(kernel, &shape, &data);
            for r in 0..shape.parity_chunks {
                prop_assert!(parity[r] == reference[r], "{kernel} parity row {r} differs");
            }
        }
    }

    #[test]
    fn every_kernel_updates_like_a_full_encode(shape in shape(), index_seed in any::<usize>()) {
        use rand::{Rng, SeedableRng};
        let mut data = stripe(&shape);
        let index = index_seed % shape.data_chunks;
        let mut rng = rand::rngs::StdRng::seed_from_u64(shape.seed ^ 0x5eed);
        let new = Buffer::random(shape.len, rng.random_range(0..64), &mut rng);
        for kernel in kernels() {
            let codec = Codec::with_kernel(shape.data_chunks, shape.parity_chunks, kernel).unwrap();
            let mut parity = encode_with(Kernel::Scalar, &shape, &data);
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
            codec.update(index, data[index].as_ref(), new.as_ref(), &mut outs).unwrap();
            let old = std::mem::replace(&mut data[index], Buffer::new(shape.len, 0));
            data[index].as_mut().copy_from_slice(new.as_ref());
            let expected = encode_with(Kernel::Scalar, &shape, &data);
            data[index] = old;
            prop_assert!(parity == expected, "{kernel} update of chunk {index} differs");
        }
    }
}

#[test]
fn reference_equals_the_definition_and_md() {
    let mut rng = common::seed("reference_equals_the_definition_and_md", 7);
    for k in [2usize, 3, 10, 33, 255] {
        let data: Vec<Buffer> = (0..k).map(|j| Buffer::random(1024, j, &mut rng)).collect();
        let sources: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
        let (md_p, md_q) = md_gen_syndrome(&sources);
        for kernel in kernels() {
            let codec = Codec::with_kernel(k, 3, kernel).unwrap();
            let mut parity = vec![vec![0u8; 1024]; 3];
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
            codec.encode(&sources, &mut outs, Stores::Cached).unwrap();
            assert_eq!(parity[0], md_p, "{kernel} P differs from md at k={k}");
            assert_eq!(parity[1], md_q, "{kernel} Q differs from md at k={k}");
            for (row, chunk) in parity.iter().enumerate() {
                assert_eq!(*chunk, definition_parity(&sources, row), "{kernel} row {row} k={k}");
            }
        }
    }
}

#[test]
fn largest_chunks_encode_correctly() {
    // 4 MiB chunks: the upper length limit, one pass of every kernel.
    let mut rng = common::seed("largest_chunks_encode_correctly", 11);
    let len = flashraid_parity::CHUNK_BYTES_MAX;
    let data: Vec<Buffer> = (0..4).map(|j| Buffer::random(len, j * 8, &mut rng)).collect();
    let sources: Vec<&[u8]> = data.iter().map(|b| b.as_ref()).collect();
    let expected: Vec<Vec<u8>> = (0..3).map(|r| definition_parity(&sources, r)).collect();
    for kernel in kernels() {
        let codec = Codec::with_kernel(4, 3, kernel).unwrap();
        let mut parity = vec![vec![0u8; len]; 3];
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.encode(&sources, &mut outs, Stores::NonTemporal).unwrap();
        assert!(parity == expected, "{kernel} differs at 4 MiB");
    }
}

#[test]
fn golden_example_from_the_on_disk_format_doc() {
    // docs/on-disk-format.md: D = [0x01, 0x02, 0x03] gives P = 0x00, Q = 0x09, R = 0x39.
    // The format is an API; this vector must never change.
    let data: Vec<Vec<u8>> = [1u8, 2, 3].iter().map(|&b| vec![b; 512]).collect();
    let sources: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    for kernel in kernels() {
        let codec = Codec::with_kernel(3, 3, kernel).unwrap();
        let mut parity = vec![vec![0u8; 512]; 3];
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.encode(&sources, &mut outs, Stores::Cached).unwrap();
        for (row, expected) in [0x00u8, 0x09, 0x39].into_iter().enumerate() {
            assert!(parity[row].iter().all(|&b| b == expected), "{kernel} row {row}");
        }
    }
}
