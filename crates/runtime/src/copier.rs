//! The copy of a `replace`: a thread of its own that copies the old member's data area to the
//! new device, so that a slow or stalling old member (the usual reason to replace one) holds
//! this thread, not the controller, which goes on serving status, failures and commands.
//!
//! Owns: the copier thread, the commands it takes ([`CopyCommand`]) and the reports it sends
//! the controller ([`CopyReport`], through the controller's inbox, tagged with the copy's
//! generation).
//!
//! Invariants:
//! - Every copier sends exactly one final report ([`CopyReport::is_final`]) and touches
//!   neither device after sending it; the controller counts a copier as running, and its
//!   new device as possibly still being written, until that report arrives.
//! - The copier writes the new device only while its command channel is open, checked
//!   before every write: a copy given up (the controller drops the sender) writes nothing
//!   more once any step in progress has finished.
//! - Steps are paced by the rebuild rate (bytes per second, 0: no limit), changed live.
//!
//! Limits: one step of [`COPY_STEP_BYTES`] at a time with synchronous IO (a copy is
//! sequential; the old member is the bottleneck); a step stalled in the kernel cannot be
//! interrupted, so a copier whose device never answers never ends (the controller keeps its
//! new device out of service meanwhile, and joins the thread when the array stops).

use crate::array::ToController;
use flashraid_uring::Device;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// Bytes one copy step moves.
pub(crate) const COPY_STEP_BYTES: u64 = 1 << 20;

/// The least time between two progress reports (the last step always reports).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// What the controller tells a running copier. Dropping the sender stops it.
#[derive(Debug)]
pub(crate) enum CopyCommand {
    /// A new pace, bytes per second (0: no limit), from the next step on.
    Rate(u64),
}

/// Which IO of a copy failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopySide {
    ReadOld,
    WriteNew,
    SyncNew,
}

/// What a copier reports.
#[derive(Debug)]
pub(crate) enum CopyReport {
    /// Bytes of the data area copied so far.
    Progress { done_bytes: u64 },
    /// Final: everything copied and the new device synced.
    Done,
    /// Final: an IO failed; nothing more was written.
    Failed { side: CopySide, error: String },
    /// Final: the controller gave the copy up; nothing more was written.
    Stopped,
}

impl CopyReport {
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self, CopyReport::Progress { .. })
    }
}

/// One copy: the two devices (handles of their own), the range, and where to report.
pub(crate) struct CopyJob {
    pub generation: u32,
    pub old: Device,
    pub new: Device,
    pub data_offset_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_s: u64,
    pub report: Sender<ToController>,
}

/// Start a copier thread. Its handle is for joining it when the array stops.
pub(crate) fn spawn(
    job: CopyJob,
) -> std::io::Result<(Sender<CopyCommand>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let handle =
        std::thread::Builder::new().name("flashraid-copy".into()).spawn(move || run(job, &rx))?;
    Ok((tx, handle))
}

fn run(job: CopyJob, commands: &Receiver<CopyCommand>) {
    let generation = job.generation;
    let report = job.report.clone();
    let last = copy(job, commands, &mut |r| {
        // The controller gone means the array stopped: nothing to tell.
        let _ = report.send(ToController::Copy(generation, r));
    });
    debug_assert!(last.is_final());
    let _ = report.send(ToController::Copy(generation, last));
}

/// Whether the copy has been given up (the controller dropped the sender), after taking any
/// rate change waiting.
fn stopped(commands: &Receiver<CopyCommand>, rate: &mut u64) -> bool {
    loop {
        match commands.try_recv() {
            Ok(CopyCommand::Rate(r)) => *rate = r,
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => return true,
        }
    }
}

/// The copy itself; returns the final report (progress goes to `progress`).
fn copy(
    job: CopyJob,
    commands: &Receiver<CopyCommand>,
    progress: &mut dyn FnMut(CopyReport),
) -> CopyReport {
    let mut rate = job.rate_bytes_per_s;
    let mut buf = flashraid_iobuf::IoBuf::new(usize::try_from(COPY_STEP_BYTES).expect("fits"));
    let mut done_bytes = 0u64;
    let mut next_at = Instant::now();
    let mut reported_at = Instant::now();
    while done_bytes < job.total_bytes {
        // Wait for the pace, answering commands meanwhile.
        loop {
            let now = Instant::now();
            if now >= next_at {
                break;
            }
            match commands.recv_timeout(next_at - now) {
                Ok(CopyCommand::Rate(r)) => {
                    rate = r;
                    next_at = now; // the new pace counts from the next step
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return CopyReport::Stopped,
            }
        }
        if stopped(commands, &mut rate) {
            return CopyReport::Stopped;
        }
        let started = Instant::now();
        let len = COPY_STEP_BYTES.min(job.total_bytes - done_bytes);
        let offset = job.data_offset_bytes + done_bytes;
        let step = &mut buf.as_mut_slice()[..usize::try_from(len).expect("fits")];
        if let Err(e) = job.old.read_at(step, offset) {
            return CopyReport::Failed { side: CopySide::ReadOld, error: e.to_string() };
        }
        // The read may have taken long: a copy given up meanwhile must not write.
        if stopped(commands, &mut rate) {
            return CopyReport::Stopped;
        }
        if let Err(e) = job.new.write_at(step, offset) {
            return CopyReport::Failed { side: CopySide::WriteNew, error: e.to_string() };
        }
        done_bytes += len;
        if rate > 0 {
            next_at = started + Duration::from_secs_f64(len as f64 / rate as f64);
        }
        if reported_at.elapsed() >= PROGRESS_INTERVAL || done_bytes == job.total_bytes {
            reported_at = Instant::now();
            progress(CopyReport::Progress { done_bytes });
        }
    }
    if stopped(commands, &mut rate) {
        return CopyReport::Stopped;
    }
    match job.new.sync() {
        Ok(()) => CopyReport::Done,
        Err(e) => CopyReport::Failed { side: CopySide::SyncNew, error: e.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashraid_uring::Access;

    fn devices(dir: &std::path::Path, size_bytes: u64) -> (Device, Device) {
        let old = Device::create_file(&dir.join("old"), size_bytes).unwrap();
        let new = Device::create_file(&dir.join("new"), size_bytes).unwrap();
        (old, new)
    }

    fn job(
        old: Device,
        new: Device,
        total_bytes: u64,
        rate: u64,
    ) -> (CopyJob, Receiver<ToController>) {
        let (tx, rx) = mpsc::channel();
        let job = CopyJob {
            generation: 7,
            old,
            new,
            data_offset_bytes: 4096,
            total_bytes,
            rate_bytes_per_s: rate,
            report: tx,
        };
        (job, rx)
    }

    fn finals(rx: &Receiver<ToController>) -> Vec<CopyReport> {
        rx.iter()
            .map(|m| match m {
                ToController::Copy(7, r) => r,
                _ => panic!("only copy reports of generation 7"),
            })
            .filter(CopyReport::is_final)
            .collect()
    }

    /// The data area (and only it) arrives on the new device, and exactly one final report.
    #[test]
    fn copies_the_data_area_and_reports_done_once() {
        let dir = tempfile::tempdir().unwrap();
        let size = 3 * COPY_STEP_BYTES + 8192;
        let (old, new) = devices(dir.path(), size);
        let pattern: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let mut aligned = flashraid_iobuf::IoBuf::new(usize::try_from(size).unwrap());
        aligned.as_mut_slice().copy_from_slice(&pattern);
        old.write_at(aligned.as_slice(), 0).unwrap();
        let total = size - 8192;
        let (job, rx) = job(old, new, total, 0);
        let (commands, handle) = spawn(job).unwrap();
        handle.join().unwrap();
        drop(commands);
        let reports = finals(&rx);
        assert!(matches!(reports.as_slice(), [CopyReport::Done]), "{reports:?}");
        let copied = Device::open(&dir.path().join("new"), Access::ReadOnly).unwrap();
        let mut back = flashraid_iobuf::IoBuf::new(usize::try_from(size).unwrap());
        copied.read_at(back.as_mut_slice(), 0).unwrap();
        let b = back.as_slice();
        assert!(b[..4096].iter().all(|&x| x == 0), "before the data area: untouched");
        assert_eq!(&b[4096..4096 + total as usize], &pattern[4096..4096 + total as usize]);
        assert!(b[4096 + total as usize..].iter().all(|&x| x == 0), "after it: untouched");
    }

    /// Dropping the command sender stops a paced copy before its end, with `Stopped`, and
    /// nothing is written after the copier has said so.
    #[test]
    fn a_copy_given_up_stops_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 * COPY_STEP_BYTES;
        let (old, new) = devices(dir.path(), size);
        // 4 MiB/s: a step every 250 ms, so the copy is far from done when it is given up.
        let (job, rx) = job(old, new, size - 4096, 4 * COPY_STEP_BYTES);
        let (commands, handle) = spawn(job).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        drop(commands);
        handle.join().unwrap();
        let reports = finals(&rx);
        assert!(matches!(reports.as_slice(), [CopyReport::Stopped]), "{reports:?}");
    }

    /// A read error of the old member ends the copy with `Failed { ReadOld }`.
    #[test]
    fn a_failing_read_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = devices(dir.path(), 2 * COPY_STEP_BYTES);
        // Past the end of the old member: its read fails.
        let (job, rx) = job(old, new, 4 * COPY_STEP_BYTES, 0);
        let (_commands, handle) = spawn(job).unwrap();
        handle.join().unwrap();
        drop(_commands);
        let reports = finals(&rx);
        assert!(
            matches!(reports.as_slice(), [CopyReport::Failed { side: CopySide::ReadOld, .. }]),
            "{reports:?}"
        );
    }
}
