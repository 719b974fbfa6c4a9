//! `Router::split` for an input-chosen valid geometry, shard count and piece size, on a few
//! input-chosen requests (in and out of range, aligned or not, near `u64::MAX`).
//!
//! Checks: it never panics; a refused request emits nothing and is refused exactly when
//! `Router::check` says so; otherwise reads and writes are cut into pieces that tile the range
//! in order, each inside one stripe, no longer than the piece limit, on the stripe's shard, with
//! the request's buffer offset; discard zeroes exactly the whole stripes inside the range;
//! write-zeroes zeroes those and writes zeroes over the rest; flush reaches every shard once.

#![no_main]

use flashraid_engine::{ArrayOp, Durability, Piece, PieceOp, Router, ZeroHow};
use flashraid_layout::{ArrayOffset, BLOCK_BYTES, Geometry, Level};
use libfuzzer_sys::arbitrary::{Arbitrary, Error, Result, Unstructured};
use libfuzzer_sys::fuzz_target;

const REQUESTS_MAX: usize = 8;
/// Longest in-range request: bounds the pieces per request (at least one 4 KiB block each).
const REQUEST_BLOCKS_MAX: u64 = 4096;

/// One case: the router's shape and the requests it cuts. Printed by `cargo fuzz fmt router
/// <input>`, which is what a regression test needs.
#[derive(Debug)]
struct Case {
    level: Level,
    members: usize,
    chunk_bytes: u64,
    member_data_bytes: u64,
    shard_count: u32,
    run_member_bytes: u64,
    piece_bytes_max: u64,
    ops: Vec<ArrayOp>,
}

impl<'a> Arbitrary<'a> for Case {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let level = *u.choose(&Level::ALL)?;
        let members = u.int_in_range(0..=66usize)?;
        let chunk_bytes = match u.int_in_range(0..=15u8)? {
            0 => u.arbitrary()?,
            shift => 1u64 << (shift + 8),
        };
        let member_data_bytes = match u.int_in_range(0..=3u8)? {
            0 => u.arbitrary()?,
            _ => chunk_bytes.saturating_mul(u.int_in_range(0..=1000)?),
        };
        // Only geometries `Geometry::new` accepts: the router is built from those.
        let geometry = Geometry::new(level, members, chunk_bytes, member_data_bytes)
            .map_err(|_| Error::IncorrectFormat)?;
        let chunk = u64::from(geometry.chunk_bytes());
        let shard_count = u.int_in_range(1..=64u32)?;
        let run_member_bytes = chunk * u.int_in_range(0..=20u64)?;
        let piece_bytes_max = match u.int_in_range(0..=3u8)? {
            0 => u.int_in_range(chunk..=u64::MAX)?,
            _ => chunk * u.int_in_range(1..=64u64)? + u.int_in_range(0..=chunk - 1)?,
        };
        let mut ops = vec![];
        for _ in 0..u.int_in_range(1..=REQUESTS_MAX)? {
            ops.push(build_op(u, &geometry)?);
        }
        Ok(Case {
            level,
            members,
            chunk_bytes,
            member_data_bytes,
            shard_count,
            run_member_bytes,
            piece_bytes_max,
            ops,
        })
    }
}

fuzz_target!(|case: Case| {
    let geometry =
        Geometry::new(case.level, case.members, case.chunk_bytes, case.member_data_bytes)
            .expect("accepted when the case was built");
    let router =
        Router::new(geometry, case.shard_count, case.run_member_bytes, case.piece_bytes_max);
    for &op in &case.ops {
        split_and_check(&router, &geometry, case.piece_bytes_max, op);
    }
});

fn build_op(u: &mut Unstructured, geometry: &Geometry) -> Result<ArrayOp> {
    // Saturating: an overflowing `array_bytes()` is for the router to meet, not the builder.
    let array_bytes = geometry.stripes().saturating_mul(geometry.stripe_data_bytes());
    let array_blocks = array_bytes / BLOCK_BYTES;
    let offset = match u.int_in_range(0..=7u8)? {
        0 => u.arbitrary()?,
        1 => u64::MAX - u.int_in_range(0..=REQUEST_BLOCKS_MAX)? * BLOCK_BYTES,
        2 => array_bytes.saturating_sub(u.int_in_range(0..=REQUEST_BLOCKS_MAX)? * BLOCK_BYTES),
        _ => u.int_in_range(0..=array_blocks)? * BLOCK_BYTES,
    };
    let len_bytes = match u.int_in_range(0..=7u8)? {
        0 => u.int_in_range(0..=REQUEST_BLOCKS_MAX * BLOCK_BYTES)?,
        1 => u.arbitrary()?,
        _ => u.int_in_range(0..=REQUEST_BLOCKS_MAX)? * BLOCK_BYTES,
    };
    let offset = ArrayOffset(offset);
    let durability = if u.arbitrary()? { Durability::Fua } else { Durability::Cached };
    Ok(match u.int_in_range(0..=4u8)? {
        0 => ArrayOp::Read { offset, len_bytes },
        1 => ArrayOp::Write { offset, len_bytes, durability },
        2 => ArrayOp::Flush,
        3 => ArrayOp::Discard { offset, len_bytes, durability },
        _ => ArrayOp::WriteZeroes { offset, len_bytes, durability },
    })
}

fn split_and_check(router: &Router, geometry: &Geometry, piece_bytes_max: u64, op: ArrayOp) {
    let range = match op {
        ArrayOp::Read { offset, len_bytes }
        | ArrayOp::Write { offset, len_bytes, .. }
        | ArrayOp::Discard { offset, len_bytes, .. }
        | ArrayOp::WriteZeroes { offset, len_bytes, .. } => Some((offset, len_bytes)),
        ArrayOp::Flush => None,
    };
    // A request the fuzzer made too long to check quickly (only possible on a huge array).
    if range.is_some_and(|(_, len)| len > REQUEST_BLOCKS_MAX * BLOCK_BYTES)
        && range.is_some_and(|(offset, len)| router.check(offset, len).is_ok())
    {
        return;
    }
    let mut pieces: Vec<Piece> = vec![];
    let result = router.split(op, &mut |piece| pieces.push(piece));
    let Some((offset, len_bytes)) = range else {
        assert_eq!(result, Ok(()));
        let shards: Vec<u32> = pieces.iter().map(|p| p.shard).collect();
        assert_eq!(shards, (0..router.shard_count()).collect::<Vec<_>>(), "flush");
        assert!(pieces.iter().all(|p| p.op == PieceOp::Flush));
        return;
    };
    assert_eq!(result, router.check(offset, len_bytes), "split and check disagree");
    let valid = len_bytes > 0
        && offset.0 % BLOCK_BYTES == 0
        && len_bytes % BLOCK_BYTES == 0
        && offset.0.checked_add(len_bytes).is_some_and(|end| end <= geometry.array_bytes());
    assert_eq!(result.is_ok(), valid, "check refuses {offset:?}+{len_bytes} wrongly");
    if result.is_err() {
        assert!(pieces.is_empty(), "a refused request emitted pieces");
        return;
    }
    let stripe_bytes = geometry.stripe_data_bytes();
    let chunk = u64::from(geometry.chunk_bytes());
    let limit = piece_bytes_max - piece_bytes_max % chunk;
    let start = offset.0;
    let end = start + len_bytes;
    let mut at = start;
    for piece in &pieces {
        let (piece_offset, piece_len, request_offset) = match (op, piece.op) {
            (ArrayOp::Read { .. }, PieceOp::Read { offset, len_bytes, request_offset }) => {
                (offset.0, u64::from(len_bytes), Some(request_offset))
            }
            (
                ArrayOp::Write { durability, .. },
                PieceOp::Write { offset, len_bytes, request_offset, durability: d },
            ) => {
                assert_eq!(d, durability);
                (offset.0, u64::from(len_bytes), Some(request_offset))
            }
            (
                ArrayOp::WriteZeroes { durability, .. },
                PieceOp::WriteZeroes { offset, len_bytes, durability: d },
            ) => {
                assert_eq!(d, durability);
                (offset.0, u64::from(len_bytes), None)
            }
            (ArrayOp::Discard { durability, .. }, PieceOp::Zero { stripe, how, durability: d }) => {
                assert_eq!((how, d), (ZeroHow::Discard, durability));
                (stripe.0 * stripe_bytes, stripe_bytes, None)
            }
            (
                ArrayOp::WriteZeroes { durability, .. },
                PieceOp::Zero { stripe, how, durability: d },
            ) => {
                assert_eq!((how, d), (ZeroHow::WriteZeroes, durability));
                (stripe.0 * stripe_bytes, stripe_bytes, None)
            }
            (op, piece) => panic!("{op:?} produced {piece:?}"),
        };
        let whole_stripe = matches!(piece.op, PieceOp::Zero { .. });
        if matches!(op, ArrayOp::Discard { .. }) {
            // Discard skips the partial stripes at either end.
            assert!(piece_offset >= at && piece_offset + piece_len <= end, "discard outside range");
        } else {
            assert_eq!(piece_offset, at, "pieces do not tile the range (gap or overlap)");
        }
        assert!(piece_len > 0, "empty piece");
        let stripe = piece_offset / stripe_bytes;
        assert_eq!((piece_offset + piece_len - 1) / stripe_bytes, stripe, "piece crosses a stripe");
        if whole_stripe {
            assert_eq!(piece_offset % stripe_bytes, 0, "zeroing a partial stripe");
        } else {
            assert!(piece_len <= limit, "piece of {piece_len} B over the limit of {limit} B");
        }
        if let Some(request_offset) = request_offset {
            assert_eq!(request_offset, piece_offset - start, "wrong buffer offset");
        }
        let run = router.ownership().run_stripes();
        let shard = u32::try_from(stripe / run % u64::from(router.shard_count())).expect("below");
        assert_eq!(piece.shard, shard, "piece on the wrong shard");
        at = piece_offset + piece_len;
    }
    if matches!(op, ArrayOp::Discard { .. }) {
        let whole: Vec<u64> = (start.div_ceil(stripe_bytes)..end / stripe_bytes).collect();
        let zeroed: Vec<u64> = pieces
            .iter()
            .map(|p| match p.op {
                PieceOp::Zero { stripe, .. } => stripe.0,
                _ => unreachable!("checked above"),
            })
            .collect();
        assert_eq!(zeroed, whole, "discard zeroes the wrong stripes");
    } else {
        assert_eq!(at, end, "pieces end short of the range");
    }
}
