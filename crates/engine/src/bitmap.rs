//! One shard's write-intent bitmap: which regions may have writes in flight, kept durable on
//! every member before any write into a region is issued, and cleared lazily.
//!
//! Owns: the in-memory bits, the on-disk image this shard writes (its own block of the bitmap
//! area, so shards never share a block), and the ordering of image writes.
//!
//! Protocol:
//! - A write into region r first `acquire`s it. If the bit is set in the last durable image
//!   the write may go at once; otherwise the bit is set in memory and the write waits for the
//!   next image (sequence number `target`) to be durable on every available member.
//! - Images are written one at a time, with FUA, to every available member. A new image is
//!   started only when the previous one completed, so an older image can never land after a
//!   newer one.
//! - Clearing is lazy: a region with no writes in flight, idle for `clear_delay_us`, whose
//!   writes a member flush has made durable, is cleared in memory and reaches the disk with
//!   the next image. A region's bit on disk is therefore cleared only after its data and
//!   parity are durable, which is what makes skipping it at the next assembly safe.
//! - Batching: every bit set while an image is in flight rides on the next image, so a burst
//!   of random writes costs one bitmap write per image round trip, not one per write.
//!
//! The missed-write map rides on the same protocol. While `recording` (this shard has some
//! role out of service), a region whose write-intent bit is cleared gets its missed bit
//! set, and the missed image is written before the write-intent image that carries the
//! clear: on disk, a region written while a role was away is always named by one map or the
//! other. A member that failed while in sync and comes back is rebuilt only in the regions
//! so named (`missed_snapshot`). The map is emptied only when no role is out of service.
//!
//! Limits: one 4 KiB block per shard and per map, at most `REGIONS_PER_BLOCK_MAX` regions.

use flashraid_format::bitmap::{BitmapBlock, BitmapKind};
use flashraid_iobuf::IoBuf;

/// One region's state.
#[derive(Clone, Copy, Debug, Default)]
struct Region {
    /// Set in the last durable image.
    on_disk: bool,
    /// Writes acquired and not released.
    writes_active: u32,
    /// When the last write was released (for the clearing delay).
    last_release_us: u64,
    /// `WriteIntent::releases` at the last write's release (for flushes: see there).
    last_release: u64,
    /// A member flush issued after the last release has completed.
    flushed: bool,
}

/// Which block an image started by `start_image` is (the caller writes it at that map's
/// offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImageKind {
    WriteIntent,
    Missed,
}

/// What `acquire` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// The region is durably marked: write now.
    Ready,
    /// Wait until image `target` is durable.
    Wait { target: u64 },
}

#[derive(Debug)]
pub(crate) struct WriteIntent {
    block: BitmapBlock,
    regions: Vec<Region>,
    /// Bits of the image being written (or last written), per region.
    image_bits: Vec<bool>,
    /// Sequence of the last image started.
    started: u64,
    /// Sequence of the last image durable everywhere.
    durable: u64,
    /// An image write is in flight.
    in_flight: bool,
    /// Memory differs from the last image started.
    changed: bool,
    clear_delay_us: u64,
    /// Write releases so far. A flush covers the writes released before it was issued,
    /// which it tells by this count, not by the clock: writes complete within the same
    /// microsecond as a flush is issued, before or after it (found by review: a write
    /// released in the turn that issued the clearing flush, at the same time stamp, counted
    /// as covered by it, and its region was cleared with the write still in a member's
    /// cache; a power cut then left the stripe's parity stale with no resync).
    releases: u64,
    /// The release count when the flush in flight (if any) was issued.
    flush_issued_at: Option<u64>,
    buf: IoBuf,
    /// The missed-write map in memory (its `sequence` is that of the last image started).
    missed: BitmapBlock,
    /// The missed map in memory differs from the last missed image started.
    missed_changed: bool,
    /// A missed image is in flight (never at the same time as a write-intent image).
    missed_in_flight: bool,
    /// Some role is out of service here: clearing a region marks it missed.
    recording: bool,
}

impl WriteIntent {
    /// Start from the blocks as the runtime wrote them before starting the shard: the
    /// write-intent block's set regions (dirty ones) are set in memory and on disk, and so
    /// are the missed-write map's.
    pub fn new(block: BitmapBlock, missed_block: BitmapBlock, clear_delay_us: u64) -> Self {
        assert_eq!(block.kind, BitmapKind::WriteIntent);
        assert_eq!(missed_block.kind, BitmapKind::Missed);
        assert_eq!(block.region_count, missed_block.region_count);
        let count = usize::try_from(block.region_count).expect("u32 fits usize");
        let mut regions = vec![Region::default(); count];
        for r in block.set_regions() {
            regions[usize::try_from(r).expect("u32 fits usize")].on_disk = true;
        }
        let image_bits = regions.iter().map(|r| r.on_disk).collect();
        Self {
            block,
            regions,
            image_bits,
            started: 0,
            durable: 0,
            in_flight: false,
            changed: false,
            clear_delay_us,
            releases: 0,
            flush_issued_at: None,
            buf: IoBuf::new(flashraid_format::bitmap::BITMAP_BLOCK_BYTES),
            missed: missed_block,
            missed_changed: false,
            missed_in_flight: false,
            recording: false,
        }
    }

    /// Whether some role is out of service for this shard (set on every health change).
    pub fn set_recording(&mut self, recording: bool) {
        self.recording = recording;
    }

    /// A region's write-intent bit is being cleared: while recording, it is missed.
    fn note_cleared(&mut self, region: u32) {
        if self.recording && !self.missed.is_set(region) {
            self.missed.set(region, true);
            self.missed_changed = true;
        }
    }

    /// Regions a member that comes back now may have missed: the missed map, and every
    /// region with its write-intent bit set (writes in flight, or finished and not yet
    /// cleared into the map).
    pub fn missed_snapshot(&self) -> Vec<bool> {
        (0..self.block.region_count)
            .map(|r| self.missed.is_set(r) || self.block.is_set(r))
            .collect()
    }

    /// A member joined (a rebuild starts onto it): the next images carry every bit of both
    /// maps to it too, so it never holds less than the others.
    pub fn rewrite_all(&mut self) {
        self.changed = true;
        self.missed_changed = true;
    }

    /// Regions set in the missed map (for status).
    pub fn missed_regions(&self) -> usize {
        self.missed.set_regions().count()
    }

    /// Every role is in service again: nothing is missed any more. Refused (false) while
    /// recording, so a failure this shard already saw keeps its map.
    pub fn clear_missed(&mut self) -> bool {
        if self.recording {
            return false;
        }
        if self.missed.set_regions().next().is_some() {
            for r in 0..self.missed.region_count {
                self.missed.set(r, false);
            }
            self.missed_changed = true;
        }
        true
    }

    fn region(&mut self, region: u32) -> &mut Region {
        &mut self.regions[usize::try_from(region).expect("u32 fits usize")]
    }

    pub fn region_count(&self) -> u32 {
        self.block.region_count
    }

    /// A write into `region` is about to be issued.
    pub fn acquire(&mut self, region: u32) -> Acquired {
        let index = usize::try_from(region).expect("u32 fits usize");
        let on_disk = {
            let r = &mut self.regions[index];
            r.writes_active += 1;
            r.flushed = false;
            r.on_disk
        };
        // The bit must be set in memory whatever the disk says: a clear waiting for the next
        // image (cleared here while the region was idle) must not reach the disk now.
        if !self.block.is_set(region) {
            self.block.set(region, true);
            self.changed = true;
        }
        // An image in flight that clears this bit will leave it clear on disk when it lands.
        let being_cleared = self.in_flight && !self.image_bits[index];
        if on_disk && !being_cleared {
            return Acquired::Ready;
        }
        if self.in_flight && self.image_bits[index] {
            // The image being written already carries this bit.
            return Acquired::Wait { target: self.started };
        }
        // The next image must carry it.
        self.changed = true;
        Acquired::Wait { target: self.started + 1 }
    }

    /// The write into `region` has completed (successfully or not).
    pub fn release(&mut self, region: u32, now_us: u64) {
        self.releases += 1;
        let releases = self.releases;
        let r = self.region(region);
        assert!(r.writes_active > 0, "bitmap release without acquire");
        r.writes_active -= 1;
        r.last_release_us = now_us;
        r.last_release = releases;
    }

    pub fn is_durable(&self, target: u64) -> bool {
        self.durable >= target
    }

    /// Whether an internal member flush would let some region be cleared.
    pub fn wants_flush(&self, now_us: u64) -> bool {
        self.flush_issued_at.is_none()
            && self.regions.iter().any(|r| {
                r.on_disk
                    && r.writes_active == 0
                    && !r.flushed
                    && now_us.saturating_sub(r.last_release_us) >= self.clear_delay_us
            })
    }

    /// A member flush (ours or a client's) is issued now, before any write completing after
    /// it is released; returns its mark for `flush_completed`.
    pub fn flush_issued(&mut self) -> u64 {
        self.flush_issued_at.get_or_insert(self.releases);
        self.releases
    }

    /// The flush `flush_issued` marked `issued` failed on a member: it proves nothing durable,
    /// and the next flush may be issued (found by review: the mark stayed, so no clearing
    /// flush was issued again and every region written after it stayed dirty until a stop).
    pub fn flush_failed(&mut self, issued: u64) {
        if self.flush_issued_at == Some(issued) {
            self.flush_issued_at = None;
        }
    }

    /// The flush `flush_issued` marked `issued` completed on every available member: the
    /// writes released before it was issued are durable.
    pub fn flush_completed(&mut self, issued: u64) {
        for r in &mut self.regions {
            if r.writes_active == 0 && r.last_release <= issued {
                r.flushed = true;
            }
        }
        if self.flush_issued_at == Some(issued) {
            self.flush_issued_at = None;
        }
    }

    /// Clear bits of idle, flushed regions that are not resyncing (`keep(r)` says which to keep).
    pub fn clear_idle(&mut self, now_us: u64, keep: &dyn Fn(u32) -> bool) {
        for index in 0..self.block.region_count {
            let r = self.regions[usize::try_from(index).expect("fits")];
            let idle = now_us.saturating_sub(r.last_release_us) >= self.clear_delay_us;
            if self.block.is_set(index) && r.writes_active == 0 && r.flushed && idle && !keep(index)
            {
                self.block.set(index, false);
                self.changed = true;
                self.note_cleared(index);
            }
        }
    }

    /// If an image should be written now, encode it and return its kind and bytes (the
    /// caller writes them to every available member, at that map's block, and calls
    /// `image_written` when all are done). A changed missed map goes first: the write-intent
    /// image that clears a region must not land before the map naming it.
    pub fn start_image(&mut self) -> Option<(ImageKind, &mut IoBuf)> {
        if self.in_flight || self.missed_in_flight {
            return None;
        }
        if self.missed_changed {
            self.missed.sequence += 1;
            self.missed_in_flight = true;
            self.missed_changed = false;
            let encoded = self.missed.encode();
            self.buf.as_mut_slice().copy_from_slice(&encoded);
            return Some((ImageKind::Missed, &mut self.buf));
        }
        if !self.changed {
            return None;
        }
        self.started += 1;
        self.block.sequence = self.started;
        self.in_flight = true;
        self.changed = false;
        for (index, bit) in self.image_bits.iter_mut().enumerate() {
            *bit = self.block.is_set(u32::try_from(index).expect("fits u32"));
        }
        let encoded = self.block.encode();
        self.buf.as_mut_slice().copy_from_slice(&encoded);
        Some((ImageKind::WriteIntent, &mut self.buf))
    }

    /// The image started last is durable on every available member.
    pub fn image_written(&mut self) {
        if self.missed_in_flight {
            self.missed_in_flight = false;
            return;
        }
        assert!(self.in_flight, "image completion without an image in flight");
        self.in_flight = false;
        self.durable = self.started;
        for (r, &bit) in self.regions.iter_mut().zip(&self.image_bits) {
            r.on_disk = bit;
        }
    }

    /// Memory differs from the last image started: another image is due.
    pub fn has_changes(&self) -> bool {
        self.changed || self.missed_changed
    }

    pub fn image_in_flight(&self) -> bool {
        self.in_flight || self.missed_in_flight
    }

    /// Regions set in memory (for status and shutdown checks).
    pub fn set_regions(&self) -> usize {
        self.block.set_regions().count()
    }

    /// Whether every bit is clear in memory and on disk and nothing is pending.
    pub fn is_clear(&self) -> bool {
        !self.image_in_flight()
            && !self.has_changes()
            && self.block.set_regions().next().is_none()
            && self.regions.iter().all(|r| !r.on_disk)
    }

    /// Clean shutdown, after a member flush that followed the last write: clear every region
    /// that is idle and flushed and not kept (`keep`: resync has not vouched for it yet),
    /// whatever the clearing delay. What stays set keeps the array dirty.
    pub fn clear_flushed(&mut self, keep: &dyn Fn(u32) -> bool) {
        for index in 0..self.block.region_count {
            let r = self.regions[usize::try_from(index).expect("fits")];
            if self.block.is_set(index) && r.writes_active == 0 && r.flushed && !keep(index) {
                self.block.set(index, false);
                self.changed = true;
                self.note_cleared(index);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashraid_format::Uuid;

    /// A shard's maps over `regions` regions, `dirty` set in the write-intent block.
    fn blocks(regions: u32, dirty: &[u32], clear_delay_us: u64) -> WriteIntent {
        let uuid = Uuid([1; 16]);
        let mut block = BitmapBlock::new(uuid, 0, 1, 1 << 20, regions);
        for &r in dirty {
            block.set(r, true);
        }
        let missed = BitmapBlock::new_kind(BitmapKind::Missed, uuid, 0, 1, 1 << 20, regions);
        WriteIntent::new(block, missed, clear_delay_us)
    }

    fn intent() -> WriteIntent {
        blocks(100, &[], 1000)
    }

    /// Region 3 written once, its image durable, flushed, idle, and cleared in memory.
    fn region_3_written_flushed_and_cleared() -> WriteIntent {
        let mut b = intent();
        b.acquire(3);
        b.start_image();
        b.image_written();
        b.release(3, 100);
        let issued = b.flush_issued();
        b.flush_completed(issued);
        b.clear_idle(2000, &|_| false);
        b
    }

    #[test]
    fn first_write_waits_for_the_image_then_later_writes_go_at_once() {
        let mut b = intent();
        assert_eq!(b.acquire(5), Acquired::Wait { target: 1 });
        // A second write to another region before the image starts rides on the same image.
        assert_eq!(b.acquire(6), Acquired::Wait { target: 1 });
        assert!(b.start_image().is_some());
        // Set while the image is in flight: needs the next image.
        assert_eq!(b.acquire(7), Acquired::Wait { target: 2 });
        assert!(b.start_image().is_none(), "one image at a time");
        b.image_written();
        assert!(b.is_durable(1) && !b.is_durable(2));
        assert_eq!(b.acquire(5), Acquired::Ready);
        assert!(b.start_image().is_some());
        b.image_written();
        assert!(b.is_durable(2));
    }

    #[test]
    fn writes_behind_an_image_in_flight_wait_for_the_right_image() {
        let mut b = intent();
        assert_eq!(b.acquire(1), Acquired::Wait { target: 1 });
        b.start_image();
        // Same region while its image is in flight: that image is enough.
        assert_eq!(b.acquire(1), Acquired::Wait { target: 1 });
        b.image_written();
        assert!(b.is_durable(1));
        assert!(b.start_image().is_none(), "nothing new to write");
    }

    #[test]
    fn clearing_needs_idle_and_flush() {
        let mut b = intent();
        b.acquire(3);
        b.start_image();
        b.image_written();
        b.release(3, 100);
        // Not idle long enough.
        b.clear_idle(500, &|_| false);
        assert_eq!(b.set_regions(), 1);
        // Idle, but no flush since the write: the write might not be durable.
        assert!(b.wants_flush(2000));
        b.clear_idle(2000, &|_| false);
        assert_eq!(b.set_regions(), 1);
        let issued = b.flush_issued();
        b.flush_completed(issued);
        b.clear_idle(2000, &|_| false);
        assert_eq!(b.set_regions(), 0);
        // The clear reaches the disk with the next image.
        assert!(b.start_image().is_some());
        b.image_written();
        assert!(b.is_clear());
    }

    #[test]
    fn a_write_after_the_flush_keeps_the_region() {
        let mut b = intent();
        b.acquire(3);
        b.start_image();
        b.image_written();
        b.release(3, 100);
        let issued = b.flush_issued();
        b.acquire(3);
        b.release(3, 200);
        b.flush_completed(issued);
        b.clear_idle(5000, &|_| false);
        assert_eq!(b.set_regions(), 1, "the write at 200 was not covered by the flush at 150");
    }

    /// Found by review: a write released in the same microsecond as the flush was issued,
    /// but after it (the reactor's turn issues the clearing flush, then takes completions,
    /// all at one time stamp), counted as covered by the flush, and its region was cleared
    /// with the write still in a member's cache.
    #[test]
    fn a_write_released_after_the_flush_in_the_same_microsecond_keeps_the_region() {
        let mut b = intent();
        b.acquire(3);
        b.start_image();
        b.image_written();
        b.acquire(3);
        b.release(3, 100);
        let issued = b.flush_issued();
        b.release(3, 100);
        b.flush_completed(issued);
        b.clear_idle(5000, &|_| false);
        assert_eq!(
            b.set_regions(),
            1,
            "a write released after the flush was issued is not durable"
        );
        let issued = b.flush_issued();
        b.flush_completed(issued);
        b.clear_idle(5000, &|_| false);
        assert!(b.start_image().is_some(), "the next flush covers it");
        b.image_written();
        assert!(b.is_clear());
    }

    /// Review finding: a write acquired while an image clearing its region was in flight went
    /// at once, and the landing image left the region clear on disk under an active write.
    #[test]
    fn a_write_during_a_clearing_image_waits_for_the_next_image() {
        let mut b = region_3_written_flushed_and_cleared();
        assert!(b.start_image().is_some(), "the clearing image");
        // A new write while the clearing image (sequence 2) is in flight.
        assert_eq!(b.acquire(3), Acquired::Wait { target: 3 });
        b.image_written();
        assert!(!b.is_durable(3));
        assert!(b.start_image().is_some(), "the image setting the bit again");
        b.image_written();
        assert!(b.is_durable(3));
        assert_eq!(b.set_regions(), 1);
    }

    /// Review finding: a region cleared in memory (image not started yet) and then written
    /// again was reported Ready, and the next image cleared it on disk under the write.
    #[test]
    fn a_write_after_a_clear_in_memory_sets_the_bit_again() {
        let mut b = region_3_written_flushed_and_cleared();
        assert_eq!(b.set_regions(), 0);
        // Still on disk, so the write may go at once, but the bit is set again in memory.
        assert_eq!(b.acquire(3), Acquired::Ready);
        assert_eq!(b.set_regions(), 1);
        b.start_image();
        b.image_written();
        b.release(3, 3000);
        assert_eq!(b.set_regions(), 1, "the image kept the bit set");
    }

    #[test]
    fn shutdown_clears_only_flushed_regions_that_are_not_kept() {
        let mut b = intent();
        for r in [1, 2, 3] {
            b.acquire(r);
        }
        b.start_image();
        b.image_written();
        b.release(1, 10);
        b.release(2, 10);
        let issued = b.flush_issued();
        b.flush_completed(issued);
        b.clear_flushed(&|r| r == 2);
        // 1 cleared; 2 kept (resync); 3 still has a write active.
        assert_eq!(b.set_regions(), 2);
    }

    #[test]
    fn resyncing_regions_are_kept() {
        let mut b = blocks(10, &[2, 4], 0);
        let issued = b.flush_issued();
        b.flush_completed(issued);
        b.clear_idle(10, &|r| r == 4);
        assert_eq!(b.set_regions(), 1);
    }

    /// While a role is out of service, a cleared region becomes missed, and the missed image
    /// is written before the write-intent image that clears it.
    #[test]
    fn a_region_cleared_while_recording_is_missed_first() {
        let mut b = intent();
        b.set_recording(true);
        b.acquire(3);
        assert_eq!(b.start_image().map(|(k, _)| k), Some(ImageKind::WriteIntent));
        b.image_written();
        b.release(3, 100);
        let issued = b.flush_issued();
        b.flush_completed(issued);
        b.clear_idle(2000, &|_| false);
        assert_eq!(b.set_regions(), 0);
        assert_eq!(b.missed_regions(), 1);
        // The missed image goes first; the clearing image only after it landed.
        assert_eq!(b.start_image().map(|(k, _)| k), Some(ImageKind::Missed));
        assert!(b.start_image().is_none(), "one image at a time");
        b.image_written();
        assert_eq!(b.start_image().map(|(k, _)| k), Some(ImageKind::WriteIntent));
        b.image_written();
        assert!(b.is_clear());
        assert_eq!(b.missed_snapshot().iter().filter(|&&m| m).count(), 1);
        // Kept while recording; emptied once every role is back.
        assert!(!b.clear_missed());
        b.set_recording(false);
        assert!(b.clear_missed());
        assert_eq!(b.missed_regions(), 0);
        assert_eq!(b.start_image().map(|(k, _)| k), Some(ImageKind::Missed));
    }

    #[test]
    fn nothing_is_missed_while_every_role_is_in_service() {
        let mut b = region_3_written_flushed_and_cleared();
        assert_eq!(b.missed_regions(), 0);
        assert_eq!(b.start_image().map(|(k, _)| k), Some(ImageKind::WriteIntent));
    }

    #[test]
    fn the_snapshot_includes_regions_still_being_written() {
        let mut b = intent();
        b.set_recording(true);
        b.acquire(7);
        let snapshot = b.missed_snapshot();
        assert!(snapshot[7] && snapshot.iter().filter(|&&m| m).count() == 1);
    }
}
