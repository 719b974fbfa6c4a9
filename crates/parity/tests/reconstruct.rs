//! Reconstruction: every erasure pattern of up to three chunks (data and parity mixed) is
//! recovered exactly, exhaustively for small stripes and by sampling up to 255 data chunks, on
//! every kernel; plans rebuild only their targets and touch nothing else.

mod common;

use common::Buffer;
use flashraid_parity::{Codec, Kernel, ParityError, Stores};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::index::sample;

/// A full stripe (data then parity) with random data and correct parity.
fn full_stripe(k: usize, m: usize, len: usize, rng: &mut StdRng) -> Vec<Vec<u8>> {
    let mut chunks: Vec<Vec<u8>> = (0..k)
        .map(|_| {
            let mut c = vec![0u8; len];
            rng.fill(c.as_mut_slice());
            c
        })
        .collect();
    let codec = Codec::with_kernel(k, m, Kernel::Scalar).unwrap();
    let mut parity = vec![vec![0u8; len]; m];
    {
        let sources: Vec<&[u8]> = chunks.iter().map(|c| c.as_slice()).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.encode(&sources, &mut outs, Stores::Cached).unwrap();
    }
    chunks.extend(parity);
    chunks
}

/// Erase `erased`, rebuild them with `kernel`, and check the result equals the original.
fn check_pattern(codec: &Codec, original: &[Vec<u8>], erased: &[usize]) {
    let plan = codec.plan_reconstruct(erased, erased).unwrap();
    let mut work: Vec<Vec<u8>> = original.to_vec();
    for &e in erased {
        work[e].fill(0x5a);
    }
    let mut stripe: Vec<&mut [u8]> = work.iter_mut().map(|c| c.as_mut_slice()).collect();
    codec.reconstruct(&plan, &mut stripe, Stores::Cached).unwrap();
    for &e in erased {
        assert!(
            work[e] == original[e],
            "{} k={} m={} erased {erased:?}: chunk {e} wrong",
            codec.kernel(),
            codec.data_chunks(),
            codec.parity_chunks()
        );
    }
    // A plan never reads more than k chunks and never reads an erased one.
    assert!(plan.sources().len() <= codec.data_chunks());
    assert!(plan.sources().iter().all(|s| !erased.contains(s)));
}

fn patterns(chunks: usize, max: usize) -> Vec<Vec<usize>> {
    let mut all = vec![];
    for a in 0..chunks {
        all.push(vec![a]);
        if max < 2 {
            continue;
        }
        for b in a + 1..chunks {
            all.push(vec![a, b]);
            if max < 3 {
                continue;
            }
            for c in b + 1..chunks {
                all.push(vec![a, b, c]);
            }
        }
    }
    all
}

#[test]
fn every_pattern_of_up_to_three_erasures_small_stripes() {
    let mut rng = common::seed("every_pattern_of_up_to_three_erasures_small_stripes", 3);
    for m in 1..=3 {
        for k in (2..=24).chain([31, 32, 47]) {
            let original = full_stripe(k, m, 512, &mut rng);
            let codecs: Vec<Codec> = Kernel::supported()
                .into_iter()
                .map(|kn| Codec::with_kernel(k, m, kn).unwrap())
                .collect();
            for pattern in patterns(k + m, m) {
                for codec in &codecs {
                    check_pattern(codec, &original, &pattern);
                }
            }
        }
    }
}

#[test]
fn sampled_patterns_up_to_255_data_chunks() {
    let mut rng = common::seed("sampled_patterns_up_to_255_data_chunks", 5);
    for k in [64usize, 128, 200, 254, 255] {
        let m = 3;
        let original = full_stripe(k, m, 1024, &mut rng);
        let codecs: Vec<Codec> = Kernel::supported()
            .into_iter()
            .map(|kn| Codec::with_kernel(k, m, kn).unwrap())
            .collect();
        // Always include the extremes: the first and last data positions and the parity rows.
        let mut chosen =
            vec![vec![0, k - 1, k + 2], vec![k - 3, k - 2, k - 1], vec![k, k + 1, k + 2]];
        for _ in 0..60 {
            let count = rng.random_range(1..=3);
            let mut pattern = sample(&mut rng, k + m, count).into_vec();
            pattern.sort_unstable();
            chosen.push(pattern);
        }
        for pattern in &chosen {
            for codec in &codecs {
                check_pattern(codec, &original, pattern);
            }
        }
    }
}

#[test]
fn partial_targets_rebuild_only_what_is_asked() {
    let mut rng = common::seed("partial_targets_rebuild_only_what_is_asked", 9);
    let (k, m, len) = (10, 3, 4096);
    let original = full_stripe(k, m, len, &mut rng);
    for kernel in Kernel::supported() {
        let codec = Codec::with_kernel(k, m, kernel).unwrap();
        // Data chunk 4 and Q are lost; only chunk 4 is wanted (a degraded read).
        let plan = codec.plan_reconstruct(&[4, k + 1], &[4]).unwrap();
        assert_eq!(plan.targets(), &[4]);
        let mut work = original.clone();
        work[4].fill(0);
        work[k + 1].fill(0xee);
        let mut stripe: Vec<&mut [u8]> = work.iter_mut().map(|c| c.as_mut_slice()).collect();
        // Q may even be absent: an empty slice.
        stripe[k + 1] = &mut [];
        codec.reconstruct(&plan, &mut stripe, Stores::Cached).unwrap();
        assert_eq!(work[4], original[4]);
        assert!(work[k + 1].iter().all(|&b| b == 0xee), "{kernel}: Q was touched");
        // One data chunk with P alive is plain XOR: every coefficient is 1.
        let xor_plan = codec.plan_reconstruct(&[7], &[7]).unwrap();
        assert!((0..xor_plan.sources().len()).all(|s| xor_plan.coefficient(0, s) == 1));
        assert!(xor_plan.sources().contains(&k), "P must be the parity used");
    }
}

#[test]
fn reconstruct_from_ordered_buffers_at_odd_alignments() {
    let mut rng = common::seed("reconstruct_from_ordered_buffers_at_odd_alignments", 13);
    let (k, m, len) = (12, 3, 8192);
    let original = full_stripe(k, m, len, &mut rng);
    for kernel in Kernel::supported() {
        let codec = Codec::with_kernel(k, m, kernel).unwrap();
        let erased = [0, 5, k + 2];
        let plan = codec.plan_reconstruct(&erased, &erased).unwrap();
        let sources: Vec<Buffer> = plan
            .sources()
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let mut b = Buffer::new(len, i * 3 + 1);
                b.as_mut().copy_from_slice(&original[s]);
                b
            })
            .collect();
        let source_refs: Vec<&[u8]> = sources.iter().map(|b| b.as_ref()).collect();
        let mut targets: Vec<Buffer> = (0..3).map(|t| Buffer::new(len, t * 17)).collect();
        let mut target_refs: Vec<&mut [u8]> = targets.iter_mut().map(|b| b.as_mut()).collect();
        codec.reconstruct_from(&plan, &source_refs, &mut target_refs, Stores::NonTemporal).unwrap();
        for (t, &chunk) in plan.targets().iter().enumerate() {
            assert_eq!(targets[t].as_ref(), original[chunk].as_slice(), "{kernel} chunk {chunk}");
        }
    }
}

/// What a degraded read does: rebuild only a sub-range of the missing chunks, from the same
/// sub-range of each source, straight into a larger destination (a request's buffer) at an
/// offset. On every kernel that must equal the same bytes of the scalar kernel's whole-chunk
/// rebuild, and write nothing around them. RAID 5 (one data chunk missing), RAID 6 (two) and
/// RAID 7.3 (three, one of them parity), at offsets and lengths within a 16 KiB chunk.
#[test]
fn a_sub_range_rebuilt_into_a_larger_buffer_equals_the_whole_chunk_reference() {
    let mut rng = common::seed("a_sub_range_rebuilt_into_a_larger_buffer", 17);
    let chunk = 16384;
    let shapes: [(usize, usize, &[usize]); 3] = [(3, 1, &[1]), (4, 2, &[0, 3]), (4, 3, &[1, 2, 5])];
    for (k, m, erased) in shapes {
        let original = full_stripe(k, m, chunk, &mut rng);
        let reference = {
            let scalar = Codec::with_kernel(k, m, Kernel::Scalar).unwrap();
            let plan = scalar.plan_reconstruct(erased, erased).unwrap();
            let mut work = original.clone();
            let mut stripe: Vec<&mut [u8]> = work.iter_mut().map(|c| c.as_mut_slice()).collect();
            scalar.reconstruct(&plan, &mut stripe, Stores::Cached).unwrap();
            work
        };
        for kernel in Kernel::supported() {
            let codec = Codec::with_kernel(k, m, kernel).unwrap();
            let plan = codec.plan_reconstruct(erased, erased).unwrap();
            let ranges = [(0, 4096), (4096, 4096), (12288, 4096), (4096, 8192), (512, 1536)];
            for (lo, len) in ranges.into_iter().chain([(0, chunk)]) {
                let sources: Vec<&[u8]> =
                    plan.sources().iter().map(|&c| &original[c][lo..lo + len]).collect();
                // One destination, poisoned, with each target at its own odd offset in it.
                let at = |t: usize| (chunk + 4096) * t + 512 * (t + 1) + 64 * t;
                let mut dst = Buffer::filled(at(3) + chunk, 3, 0xc3);
                {
                    let mut rest = dst.as_mut();
                    let mut targets: Vec<&mut [u8]> = vec![];
                    let mut rest_at = 0;
                    for t in 0..plan.targets().len() {
                        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at(t) - rest_at);
                        let (piece, tail) = tail.split_at_mut(len);
                        targets.push(piece);
                        rest = tail;
                        rest_at = at(t) + len;
                    }
                    codec.reconstruct_from(&plan, &sources, &mut targets, Stores::Cached).unwrap();
                }
                let what = format!("{kernel} k={k} m={m} erased {erased:?} {lo}+{len}");
                let mut expected = vec![0xc3u8; at(3) + chunk];
                for (t, &c) in plan.targets().iter().enumerate() {
                    expected[at(t)..at(t) + len].copy_from_slice(&reference[c][lo..lo + len]);
                    assert_eq!(reference[c], original[c], "the scalar reference is right");
                }
                assert!(
                    dst.as_ref() == expected.as_slice(),
                    "{what}: wrong bytes or written around"
                );
            }
        }
    }
}

#[test]
fn bad_requests_are_refused_and_write_nothing() {
    let codec = Codec::new(4, 2).unwrap();
    assert_eq!(Codec::new(1, 2).unwrap_err(), ParityError::DataChunkCount { count: 1 });
    assert_eq!(Codec::new(256, 2).unwrap_err(), ParityError::DataChunkCount { count: 256 });
    assert_eq!(Codec::new(4, 4).unwrap_err(), ParityError::ParityChunkCount { count: 4 });
    let data = vec![vec![1u8; 512]; 4];
    let sources: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut p = vec![0u8; 512];
    let mut q = vec![0u8; 512];
    let mut short = vec![0u8; 256];
    assert_eq!(
        codec.encode(&sources, &mut [&mut p, &mut short], Stores::Cached).unwrap_err(),
        ParityError::LengthMismatch { first_bytes: 512, other_bytes: 256 }
    );
    assert!(p.iter().all(|&b| b == 0), "a refused call wrote parity");
    assert_eq!(
        codec.encode(&sources[..3], &mut [&mut p, &mut q], Stores::Cached).unwrap_err(),
        ParityError::BufferCount { what: "data", expected: 4, actual: 3 }
    );
    let odd: Vec<Vec<u8>> = vec![vec![0u8; 700]; 4];
    let odd_sources: Vec<&[u8]> = odd.iter().map(|d| d.as_slice()).collect();
    let mut p700 = vec![0u8; 700];
    let mut q700 = vec![0u8; 700];
    assert_eq!(
        codec.encode(&odd_sources, &mut [&mut p700, &mut q700], Stores::Cached).unwrap_err(),
        ParityError::ChunkLength { len_bytes: 700 }
    );
    assert_eq!(
        codec.plan_reconstruct(&[0, 1, 2], &[0]).unwrap_err(),
        ParityError::TooManyErasures { erased: 3, parity_chunks: 2 }
    );
    assert_eq!(
        codec.plan_reconstruct(&[0], &[1]).unwrap_err(),
        ParityError::TargetNotErased { index: 1 }
    );
    assert_eq!(
        codec.plan_reconstruct(&[6], &[6]).unwrap_err(),
        ParityError::ChunkIndexOutOfRange { index: 6, chunks: 6 }
    );
    assert_eq!(
        codec.plan_reconstruct(&[1, 1], &[1]).unwrap_err(),
        ParityError::DuplicateChunkIndex { index: 1 }
    );
    let other = Codec::new(5, 2).unwrap().plan_reconstruct(&[0], &[0]).unwrap();
    let mut stripe: Vec<&mut [u8]> = vec![];
    assert!(matches!(
        codec.reconstruct(&other, &mut stripe, Stores::Cached).unwrap_err(),
        ParityError::PlanShape { .. }
    ));
    assert!(matches!(
        codec.update(4, &data[0], &data[1], &mut [&mut p, &mut q]).unwrap_err(),
        ParityError::ChunkIndexOutOfRange { index: 4, chunks: 4 }
    ));
}
