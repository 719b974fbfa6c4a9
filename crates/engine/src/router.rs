//! Cutting array requests into shard requests.
//!
//! Owns: the cutting of a read or write into pieces that each stay inside
//! one stripe and are at most `piece_bytes_max` long (cut at chunk boundaries), and of discard
//! and write-zeroes into whole-stripe zeroing plus, for write-zeroes, plain writes of zeroes
//! for the partial stripes at either end; each piece goes to its stripe's shard
//! ([`crate::owner`] decides which). Pure arithmetic.

use crate::owner::Ownership;
use crate::request::{Durability, ZeroHow};
use flashraid_layout::{ArrayOffset, BLOCK_BYTES, Geometry, StripeIndex};

/// What an array request does, before cutting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrayOp {
    Read {
        offset: ArrayOffset,
        len_bytes: u64,
    },
    Write {
        offset: ArrayOffset,
        len_bytes: u64,
        durability: Durability,
    },
    Flush,
    /// Advisory: whole stripes are deallocated; partial stripes at the ends are left alone.
    /// With `Durability::Fua`, what it changed is durable when it completes (each stripe's
    /// members are flushed once their discards are done), as for write-zeroes.
    Discard {
        offset: ArrayOffset,
        len_bytes: u64,
        durability: Durability,
    },
    /// Whole stripes are zeroed on the members; partial stripes are written with zeroes.
    WriteZeroes {
        offset: ArrayOffset,
        len_bytes: u64,
        durability: Durability,
    },
}

/// One piece of an array request for one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceOp {
    /// Read or write `len_bytes` at `offset`; `request_offset` is where the bytes sit in the
    /// array request's buffer.
    Read {
        offset: ArrayOffset,
        len_bytes: u32,
        request_offset: u64,
    },
    Write {
        offset: ArrayOffset,
        len_bytes: u32,
        request_offset: u64,
        durability: Durability,
    },
    /// Write zeroes (a partial stripe of a write-zeroes request): no data in the request.
    WriteZeroes {
        offset: ArrayOffset,
        len_bytes: u32,
        durability: Durability,
    },
    Zero {
        stripe: StripeIndex,
        how: ZeroHow,
        durability: Durability,
    },
    Flush,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub shard: u32,
    pub op: PieceOp,
}

/// Why an array request is invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("range {offset}+{len_bytes} is outside the array of {array_bytes} bytes")]
    OutOfRange { offset: u64, len_bytes: u64, array_bytes: u64 },
    #[error("offset {offset} or length {len_bytes} is not a multiple of 4096")]
    Misaligned { offset: u64, len_bytes: u64 },
    #[error("zero-length request")]
    Empty,
}

#[derive(Clone, Copy, Debug)]
pub struct Router {
    geometry: Geometry,
    ownership: Ownership,
    piece_bytes_max: u64,
}

impl Router {
    /// `stripe_run_member_bytes`: the shards' `ShardConfig` value (the same rule must route
    /// and serve).
    pub fn new(
        geometry: Geometry,
        shard_count: u32,
        stripe_run_member_bytes: u64,
        piece_bytes_max: u64,
    ) -> Self {
        assert!(shard_count >= 1);
        assert!(piece_bytes_max >= u64::from(geometry.chunk_bytes()));
        let ownership = Ownership::for_geometry(&geometry, shard_count, stripe_run_member_bytes);
        Self { geometry, ownership, piece_bytes_max }
    }

    pub fn shard_of(&self, stripe: StripeIndex) -> u32 {
        self.ownership.shard_of(stripe.0)
    }

    pub fn shard_count(&self) -> u32 {
        self.ownership.shard_count()
    }

    pub fn ownership(&self) -> Ownership {
        self.ownership
    }

    /// Check an array request's range.
    pub fn check(&self, offset: ArrayOffset, len_bytes: u64) -> Result<(), RouteError> {
        if len_bytes == 0 {
            return Err(RouteError::Empty);
        }
        if !offset.0.is_multiple_of(BLOCK_BYTES) || !len_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(RouteError::Misaligned { offset: offset.0, len_bytes });
        }
        let array_bytes = self.geometry.array_bytes();
        if offset.0.checked_add(len_bytes).is_none_or(|end| end > array_bytes) {
            return Err(RouteError::OutOfRange { offset: offset.0, len_bytes, array_bytes });
        }
        Ok(())
    }

    /// Cut a request into pieces, calling `sink` for each, in array order.
    pub fn split(&self, op: ArrayOp, sink: &mut dyn FnMut(Piece)) -> Result<(), RouteError> {
        match op {
            ArrayOp::Flush => {
                for shard in 0..self.shard_count() {
                    sink(Piece { shard, op: PieceOp::Flush });
                }
            }
            ArrayOp::Read { offset, len_bytes } => {
                self.check(offset, len_bytes)?;
                self.cut(offset, len_bytes, &mut |shard, offset, len, at| {
                    sink(Piece {
                        shard,
                        op: PieceOp::Read { offset, len_bytes: len, request_offset: at },
                    })
                });
            }
            ArrayOp::Write { offset, len_bytes, durability } => {
                self.check(offset, len_bytes)?;
                self.cut(offset, len_bytes, &mut |shard, offset, len, at| {
                    let op =
                        PieceOp::Write { offset, len_bytes: len, request_offset: at, durability };
                    sink(Piece { shard, op })
                });
            }
            ArrayOp::Discard { offset, len_bytes, durability } => {
                self.check(offset, len_bytes)?;
                self.zero_stripes(offset, len_bytes, ZeroHow::Discard, durability, sink, false);
            }
            ArrayOp::WriteZeroes { offset, len_bytes, durability } => {
                self.check(offset, len_bytes)?;
                self.zero_stripes(offset, len_bytes, ZeroHow::WriteZeroes, durability, sink, true);
            }
        }
        Ok(())
    }

    /// Cut `[offset, offset+len)` at stripe boundaries and at `piece_bytes_max` (on chunk
    /// boundaries).
    fn cut(
        &self,
        offset: ArrayOffset,
        len_bytes: u64,
        emit: &mut dyn FnMut(u32, ArrayOffset, u32, u64),
    ) {
        let stripe_bytes = self.geometry.stripe_data_bytes();
        let chunk = u64::from(self.geometry.chunk_bytes());
        let max = self.piece_bytes_max - self.piece_bytes_max % chunk;
        let mut at = offset.0;
        let end = offset.0 + len_bytes;
        while at < end {
            let stripe_end = (at / stripe_bytes + 1) * stripe_bytes;
            let mut piece_end = stripe_end.min(end);
            if piece_end - at > max {
                // Cut on a chunk boundary so pieces of one stripe touch disjoint chunks.
                piece_end = (at / chunk) * chunk + max;
            }
            let stripe = StripeIndex(at / stripe_bytes);
            let len = u32::try_from(piece_end - at).expect("pieces fit u32");
            emit(self.shard_of(stripe), ArrayOffset(at), len, at - offset.0);
            at = piece_end;
        }
    }

    fn zero_stripes(
        &self,
        offset: ArrayOffset,
        len_bytes: u64,
        how: ZeroHow,
        durability: Durability,
        sink: &mut dyn FnMut(Piece),
        zero_partials: bool,
    ) {
        let stripe_bytes = self.geometry.stripe_data_bytes();
        let end = offset.0 + len_bytes;
        let first_full = offset.0.div_ceil(stripe_bytes);
        let last_full = end / stripe_bytes; // exclusive
        if first_full >= last_full {
            if zero_partials {
                self.write_zeroes(offset.0, end, durability, sink);
            }
            return;
        }
        if zero_partials {
            self.write_zeroes(offset.0, first_full * stripe_bytes, durability, sink);
        }
        for s in first_full..last_full {
            let stripe = StripeIndex(s);
            sink(Piece {
                shard: self.shard_of(stripe),
                op: PieceOp::Zero { stripe, how, durability },
            });
        }
        if zero_partials {
            self.write_zeroes(last_full * stripe_bytes, end, durability, sink);
        }
    }

    /// Plain writes of zeroes over `[from, to)` (partial stripes).
    fn write_zeroes(
        &self,
        from: u64,
        to: u64,
        durability: Durability,
        sink: &mut dyn FnMut(Piece),
    ) {
        if from >= to {
            return;
        }
        self.cut(ArrayOffset(from), to - from, &mut |shard, offset, len, _| {
            sink(Piece { shard, op: PieceOp::WriteZeroes { offset, len_bytes: len, durability } })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashraid_layout::Level;

    fn router(shards: u32) -> Router {
        let g = Geometry::new(Level::Raid6, 6, 16384, 16384 * 100).unwrap();
        Router::new(g, shards, 0, 32768)
    }

    #[test]
    fn reads_cut_at_stripes_and_size_and_cover_the_range() {
        let r = router(2);
        let stripe = 4 * 16384;
        let mut pieces = vec![];
        r.split(ArrayOp::Read { offset: ArrayOffset(12288), len_bytes: 2 * stripe }, &mut |p| {
            pieces.push(p)
        })
        .unwrap();
        let mut covered = 12288;
        for p in &pieces {
            let PieceOp::Read { offset, len_bytes, request_offset } = p.op else { panic!() };
            assert_eq!(offset.0, covered);
            assert_eq!(request_offset, covered - 12288);
            assert!(len_bytes <= 32768);
            let s = offset.0 / stripe;
            assert_eq!((offset.0 + u64::from(len_bytes) - 1) / stripe, s, "within one stripe");
            assert_eq!(p.shard, u32::try_from(s / r.ownership.run_stripes() % 2).unwrap());
            covered += u64::from(len_bytes);
        }
        assert_eq!(covered, 12288 + 2 * stripe);
    }

    #[test]
    fn write_zeroes_zeroes_whole_stripes_and_writes_the_ends() {
        let r = router(1);
        let stripe = 4 * 16384;
        let mut pieces = vec![];
        let op = ArrayOp::WriteZeroes {
            offset: ArrayOffset(4096),
            len_bytes: 3 * stripe,
            durability: Durability::Cached,
        };
        r.split(op, &mut |p| pieces.push(p)).unwrap();
        let zero_stripes: Vec<u64> = pieces
            .iter()
            .filter_map(|p| match p.op {
                PieceOp::Zero { stripe, .. } => Some(stripe.0),
                _ => None,
            })
            .collect();
        assert_eq!(zero_stripes, vec![1, 2]);
        let written: u64 = pieces
            .iter()
            .filter_map(|p| match p.op {
                PieceOp::WriteZeroes { len_bytes, .. } => Some(u64::from(len_bytes)),
                _ => None,
            })
            .sum();
        assert_eq!(written, stripe - 4096 + 4096);
        // Discard leaves the partial ends alone, and carries its durability to every stripe
        // it zeroes (a FUA discard is made durable where it wrote, by the shards).
        for durability in [Durability::Cached, Durability::Fua] {
            let mut pieces = vec![];
            let op =
                ArrayOp::Discard { offset: ArrayOffset(4096), len_bytes: 3 * stripe, durability };
            r.split(op, &mut |p| pieces.push(p)).unwrap();
            let zeroed: Vec<u64> = pieces
                .iter()
                .map(|p| match p.op {
                    PieceOp::Zero { stripe, how: ZeroHow::Discard, durability: d } => {
                        assert_eq!(d, durability);
                        stripe.0
                    }
                    other => panic!("a discard cut into {other:?}"),
                })
                .collect();
            assert_eq!(zeroed, vec![1, 2]);
        }
    }

    #[test]
    fn bad_ranges_are_refused() {
        let r = router(1);
        assert_eq!(
            r.check(ArrayOffset(1), 4096),
            Err(RouteError::Misaligned { offset: 1, len_bytes: 4096 })
        );
        assert_eq!(r.check(ArrayOffset(0), 0), Err(RouteError::Empty));
        let size = 4 * 16384 * 100;
        assert!(matches!(
            r.check(ArrayOffset(size - 4096), 8192),
            Err(RouteError::OutOfRange { .. })
        ));
        assert!(matches!(
            r.check(ArrayOffset(u64::MAX - 4095), 4096),
            Err(RouteError::OutOfRange { .. })
        ));
    }
}
