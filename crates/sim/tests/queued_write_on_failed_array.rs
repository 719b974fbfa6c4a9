//! A write accepted while the array was within its tolerance, still queued (merge window)
//! when the failure that fails the array lands, is planned afterwards with every parity row
//! of its stripe out. It is refused (`ArrayFailed`) and nothing of it is written, so the
//! member failed last, which a forced start brings back as having missed no write, holds
//! what the stripe held (found by review: a data-only plan wrote the data though the array
//! had failed), and every block reads as written or is refused, never wrong.
use flashraid_engine::{ArrayOp, Durability};
use flashraid_layout::{ArrayOffset, Level, MemberIndex, Role, StripeIndex};
use flashraid_sim::{SimArray, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn a_queued_write_planned_after_the_array_failed_is_never_read_back_wrong() {
    for (level, members) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let mut rng = StdRng::seed_from_u64(members as u64);
        let mut o = SimOptions::new(1, level, members);
        o.member_bytes = 3 << 20;
        o.shards = 1;
        o.config.merge_window_us = 5_000;
        let mut array = SimArray::create(o.clone()).unwrap();
        let data = array.fill_random(&mut rng);
        let g = array.geometry();
        let tol = g.tolerance();
        for role in 0..tol - 1 {
            array.fail_member(role);
        }
        array.run_steps(1000);
        // Roles 0..tol hold parity rows (the last, role tol-1, fails last), role tol holds
        // data index i (written), and some other data chunk is on a role that stays.
        let (stripe, index) = (0..g.stripes())
            .find_map(|s| {
                let s = StripeIndex(s);
                let parity_out = (0..tol)
                    .all(|r| matches!(g.role(s, MemberIndex(r as u16)), Role::Parity { .. }));
                let Role::Data { .. } = g.role(s, MemberIndex(tol as u16)) else { return None };
                let i = (0..g.data_chunks()).find(|&i| g.data_member(s, i, 0).get() == tol)?;
                parity_out.then_some((s.0, i))
            })
            .expect("a stripe with the parity rows on roles 0..tol");
        let offset = stripe * g.stripe_data_bytes() + index as u64 * u64::from(g.chunk_bytes());
        let piece: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
        let op = ArrayOp::Write {
            offset: ArrayOffset(offset),
            len_bytes: 4096,
            durability: Durability::Cached,
        };
        let ticket = array.submit(op, Some(&piece)).unwrap();
        array.run_steps(2); // accepted and queued behind the merge window
        assert!(!array.is_done(ticket));
        // A data member other than the written one fails (at the tolerance), then the last
        // parity row's member: the array is failed past its tolerance, and a forced start
        // brings back the parity member, failed last.
        let other = (0..members).find(|&r| r > tol).unwrap();
        array.fail_member(other);
        array.run_steps(1);
        array.fail_member(tol - 1);
        let result = array.wait(ticket);
        assert_eq!(result.err(), Some(flashraid_engine::RequestError::ArrayFailed), "{level}");
        array.run_steps(5000);
        let devices = array.shutdown().unwrap();
        for d in &devices {
            d.state().gone = false;
        }
        let mut array = SimArray::assemble_forced(devices, o.clone()).unwrap();
        let at = offset as usize;
        let want = data.clone();
        // Refused (the stripe is untrusted) or the old bytes: never the refused write's.
        if let Ok(got) = array.read(offset, 4096) {
            assert!(got == data[at..at + 4096], "{level}: written though failed");
        }
        array.reads_never_wrong(&want, &format!("{level}"));
    }
}
