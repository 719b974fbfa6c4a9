//! Scrub at 1 MiB chunks at the shard seam (the simulator caps chunks at 256 KiB), over
//! simulated member bytes (`common::Mem`): a syndrome-located chunk is repaired, and a check
//! scrub keeps the readable rest of a chunk with one bad sector (it changed 16 readable
//! blocks when scrub rewrote whole chunks).
use flashraid_engine::{RequestId, Shard, ShardConfig, ShardOp, ShardRequest};
use flashraid_iobuf::IoBuf;
use flashraid_layout::{ArrayOffset, Geometry, Level, MemberIndex, Role, StripeIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::{DATA_OFFSET, Mem, drive, setup_with};

const STRIPES: u64 = 6;

/// A shard at `chunk` bytes over members filled with `model` through the engine.
fn filled(level: Level, n: usize, chunk: u64, seed: u64) -> (Shard, Mem, Vec<u8>, u64) {
    let config = ShardConfig {
        scratch_bytes: 32 << 20,
        bitmap_clear_delay_us: 60_000_000,
        ..ShardConfig::recommended()
    };
    let mut setup = setup_with(config, level, n, &[], &[]);
    setup.geometry = Geometry::new(level, n, chunk, STRIPES * chunk).unwrap();
    setup.bitmap.region_bytes = 4 * chunk;
    let mut s = Shard::new(setup).unwrap();
    let g = *s.geometry();
    let mut mem = Mem {
        data: vec![vec![0u8; (DATA_OFFSET + STRIPES * chunk) as usize]; n],
        bad: vec![vec![]; n],
    };
    let size = g.stripe_data_bytes() * STRIPES;
    let mut model = vec![0u8; size as usize];
    StdRng::seed_from_u64(seed).fill(model.as_mut_slice());
    let mut now = 0;
    let piece = 256u64 << 10;
    let mut at = 0;
    while at < size {
        let mut buf = IoBuf::new(piece as usize);
        buf.as_mut_slice().copy_from_slice(&model[at as usize..(at + piece) as usize]);
        s.submit(ShardRequest {
            id: RequestId(at + 1),
            op: ShardOp::Write {
                offset: ArrayOffset(at),
                len_bytes: piece as u32,
                durability: flashraid_engine::Durability::Cached,
            },
            buf: Some(buf),
        })
        .unwrap();
        drive(&mut s, &mut mem, &mut now);
        while let Some(r) = s.poll_reply() {
            r.result.expect("write");
        }
        at += piece;
    }
    (s, mem, model, now)
}

fn scrub(
    s: &mut Shard,
    mem: &mut Mem,
    now: &mut u64,
    repair: bool,
) -> flashraid_engine::ScrubTally {
    s.start_scrub(repair, 0);
    drive(s, mem, now);
    let st = s.scrub_status().unwrap();
    assert!(!st.running);
    st.tally
}

fn member_of(g: &Geometry, stripe: u64, chunk_index: usize) -> usize {
    let k = g.data_chunks();
    (0..g.member_count())
        .find(|&m| match g.role(StripeIndex(stripe), MemberIndex(m as u16)) {
            Role::Data { index, .. } => index == chunk_index,
            Role::Parity { .. } => {
                chunk_index >= k && g.parity_member(StripeIndex(stripe), chunk_index - k).get() == m
            }
        })
        .unwrap()
}

/// RAID 6 and 7.3 at 1 MiB chunks: a corrupted data chunk and a corrupted parity chunk (in
/// other stripes) are located and repaired exactly; on 7.3, two corrupted chunks of one
/// stripe are not located and no data chunk is rewritten.
#[test]
fn scrub_locates_and_repairs_at_1m_chunks() {
    let chunk = 1u64 << 20;
    for (level, n) in [(Level::Raid6, 6), (Level::Raid7_3, 7)] {
        let (mut s, mut mem, model, mut now) = filled(level, n, chunk, 1);
        let g = *s.geometry();
        let k = g.data_chunks();
        let at = |st: u64| (DATA_OFFSET + g.member_offset(StripeIndex(st), 0).0) as usize;
        let d1 = member_of(&g, 1, 1);
        mem.data[d1][at(1) + 700_000] ^= 0x11;
        let p2 = member_of(&g, 2, k + 1);
        mem.data[p2][at(2) + 5] ^= 0x22;
        let mut two = None;
        if level == Level::Raid7_3 {
            let (a, b) = (member_of(&g, 3, 0), member_of(&g, 3, k));
            mem.data[a][at(3) + 100] ^= 0x33;
            mem.data[b][at(3) + 900_000] ^= 0x44;
            two = Some(mem.data.clone());
        }
        let t = scrub(&mut s, &mut mem, &mut now, true);
        eprintln!("{level}: {t:?}");
        for st in [1u64, 2] {
            for i in 0..k {
                let m = member_of(&g, st, i);
                let a = (st * g.stripe_data_bytes() + i as u64 * chunk) as usize;
                assert!(
                    mem.data[m][at(st)..][..chunk as usize] == model[a..][..chunk as usize],
                    "{level}: stripe {st} data {i}"
                );
            }
        }
        if let Some(before) = two {
            for i in 0..k {
                let m = member_of(&g, 3, i);
                assert!(
                    mem.data[m][at(3)..][..chunk as usize] == before[m][at(3)..][..chunk as usize],
                    "{level}: stripe 3 data {i} rewritten"
                );
            }
        }
        let t = scrub(&mut s, &mut mem, &mut now, false);
        assert_eq!(t.mismatches, 0, "{level}: {t:?}");
    }
}

/// RAID 5 at 1 MiB chunks: a parity chunk silently wrong (a lost write) and one bad 4 KiB
/// sector at the start of a data chunk of the same stripe. A *check* scrub rewrites the whole
/// 1 MiB data chunk from its reconstruction through the wrong parity: 1020 KiB of readable,
/// correct data are replaced (and the stripe now looks consistent: the damage is hidden
/// from every later scrub).
#[test]
fn raid5_check_scrub_keeps_the_readable_rest_of_a_1m_chunk() {
    let chunk = 1u64 << 20;
    let (mut s, mut mem, model, mut now) = filled(Level::Raid5, 4, chunk, 2);
    let g = *s.geometry();
    let st = 2u64;
    let at = (DATA_OFFSET + g.member_offset(StripeIndex(st), 0).0) as usize;
    let p = member_of(&g, st, g.data_chunks());
    // A lost 64 KiB write on the parity member: stale bytes there.
    for b in &mut mem.data[p][at + 512 * 1024..][..64 * 1024] {
        *b ^= 0x5a;
    }
    let d0 = member_of(&g, st, 0);
    mem.bad[d0].push((at as u64, 4096));
    let t = scrub(&mut s, &mut mem, &mut now, false);
    eprintln!("{t:?}");
    let a = (st * g.stripe_data_bytes()) as usize;
    let changed = (1..chunk as usize / 4096)
        .filter(|b| mem.data[d0][at + b * 4096..][..4096] != model[a + b * 4096..][..4096])
        .count();
    assert_eq!(
        changed, 0,
        "a check scrub changed {changed} readable 4 KiB blocks beside one bad sector: {t:?}"
    );
}
