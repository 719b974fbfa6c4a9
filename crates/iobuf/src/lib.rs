//! Aligned IO buffers and the bounded pool they come from.
//!
//! Owns: memory for member IO. Every buffer is aligned to [`IO_ALIGN_BYTES`] (what O_DIRECT on
//! block devices and files needs) and is allocated when its pool is built, never per IO.
//!
//! Why buffers are moved by value: an IO in flight owns its buffer. The engine hands an
//! [`IoBuf`] to a driver together with the IO and gets it back with the completion, so no
//! reference to memory the kernel is writing can exist in safe code at the same time. The heap
//! storage of a buffer never moves while the buffer is alive, so a driver may give its address
//! to the kernel for as long as it holds the buffer.
//!
//! Invariants: `as_slice().len() == capacity_bytes()` for the buffer's size class; the start of
//! the slice is `IO_ALIGN_BYTES`-aligned; a pool never holds more buffers than it was built
//! with, and `take` on an empty class returns `None` (backpressure), it does not allocate.
//!
//! No `unsafe`: alignment comes from over-allocating a `Vec<u8>` and starting at the first
//! aligned byte.

#![forbid(unsafe_code)]

/// Alignment of every buffer, in bytes: the logical block size of 4Kn devices, and a multiple
/// of every sector size O_DIRECT accepts.
pub const IO_ALIGN_BYTES: usize = 4096;

/// One aligned buffer of a fixed capacity.
#[derive(Debug)]
pub struct IoBuf {
    storage: Vec<u8>,
    start: usize,
    capacity_bytes: usize,
    class: u8,
}

impl IoBuf {
    /// A new zeroed buffer. Pools call this at start; outside a pool, use it only at setup.
    pub fn new(capacity_bytes: usize) -> Self {
        Self::with_class(capacity_bytes, 0)
    }

    fn with_class(capacity_bytes: usize, class: u8) -> Self {
        assert!(capacity_bytes > 0 && capacity_bytes.is_multiple_of(IO_ALIGN_BYTES));
        let storage = vec![0u8; capacity_bytes + IO_ALIGN_BYTES];
        let misalign = storage.as_ptr() as usize % IO_ALIGN_BYTES;
        let start = (IO_ALIGN_BYTES - misalign) % IO_ALIGN_BYTES;
        Self { storage, start, capacity_bytes, class }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.capacity_bytes]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.capacity_bytes]
    }

    /// The address of the first byte, for a driver that hands the buffer to the kernel. Stable
    /// for the buffer's lifetime (the storage is never reallocated).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }

    /// Index of the size class of the pool this buffer belongs to.
    pub fn class(&self) -> usize {
        usize::from(self.class)
    }
}

/// Why a pool could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// Size classes must be distinct multiples of `IO_ALIGN_BYTES`, ascending.
    BadClasses,
    /// More classes than a buffer can name.
    TooManyClasses,
}

/// A bounded pool of buffers in a few size classes (for example 4 KiB, 16 KiB, 64 KiB).
#[derive(Debug)]
pub struct BufPool {
    class_bytes: Vec<usize>,
    free: Vec<Vec<IoBuf>>,
    built: Vec<usize>,
}

impl BufPool {
    /// Build a pool with `count` buffers of each `(capacity_bytes, count)` class. All memory
    /// is allocated (and zeroed, so it is faulted in) here.
    pub fn new(classes: &[(usize, usize)]) -> Result<Self, PoolError> {
        if classes.len() > usize::from(u8::MAX) {
            return Err(PoolError::TooManyClasses);
        }
        let ascending = classes.windows(2).all(|w| w[0].0 < w[1].0);
        let aligned = classes.iter().all(|&(b, _)| b > 0 && b.is_multiple_of(IO_ALIGN_BYTES));
        if !ascending || !aligned || classes.is_empty() {
            return Err(PoolError::BadClasses);
        }
        let mut free = Vec::with_capacity(classes.len());
        for (index, &(capacity_bytes, count)) in classes.iter().enumerate() {
            let class = u8::try_from(index).map_err(|_| PoolError::TooManyClasses)?;
            free.push((0..count).map(|_| IoBuf::with_class(capacity_bytes, class)).collect());
        }
        Ok(Self {
            class_bytes: classes.iter().map(|&(b, _)| b).collect(),
            free,
            built: classes.iter().map(|&(_, c)| c).collect(),
        })
    }

    /// The smallest class that holds `len_bytes`, if any.
    pub fn class_for(&self, len_bytes: usize) -> Option<usize> {
        self.class_bytes.iter().position(|&b| b >= len_bytes)
    }

    /// Take a buffer of at least `len_bytes` from the smallest class that fits and has one
    /// free. `None` means backpressure: wait for a buffer to come back.
    pub fn take(&mut self, len_bytes: usize) -> Option<IoBuf> {
        let first = self.class_for(len_bytes)?;
        (first..self.free.len()).find_map(|class| self.free[class].pop())
    }

    /// Give a buffer back. Panics if the buffer did not come from this pool's shape or the
    /// class would hold more than it was built with: both are broken invariants.
    pub fn give(&mut self, buffer: IoBuf) {
        let class = buffer.class();
        assert_eq!(self.class_bytes[class], buffer.capacity_bytes(), "buffer from another pool");
        assert!(self.free[class].len() < self.built[class], "buffer given back twice");
        self.free[class].push(buffer);
    }

    /// Free buffers in each class.
    pub fn free_counts(&self) -> Vec<usize> {
        self.free.iter().map(|f| f.len()).collect()
    }

    /// Buffers built in each class.
    pub fn built_counts(&self) -> &[usize] {
        &self.built
    }

    /// Capacity of each class.
    pub fn class_bytes(&self) -> &[usize] {
        &self.class_bytes
    }

    /// Whether every buffer is back (used by tests and at shutdown to find leaks).
    pub fn is_full(&self) -> bool {
        self.free.iter().zip(&self.built).all(|(f, &b)| f.len() == b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_sized() {
        let mut buf = IoBuf::new(8192);
        assert_eq!(buf.as_slice().len(), 8192);
        assert_eq!(buf.as_mut_ptr() as usize % IO_ALIGN_BYTES, 0);
    }

    #[test]
    fn pool_is_bounded_and_picks_the_smallest_fitting_class() {
        let mut pool = BufPool::new(&[(4096, 2), (16384, 1)]).unwrap();
        let a = pool.take(100).unwrap();
        assert_eq!(a.capacity_bytes(), 4096);
        let b = pool.take(4096).unwrap();
        // The 4 KiB class is empty now: a small request falls through to a larger class.
        let c = pool.take(10).unwrap();
        assert_eq!(c.capacity_bytes(), 16384);
        assert!(pool.take(1).is_none(), "an empty pool is backpressure, not growth");
        assert!(pool.take(20000).is_none());
        pool.give(a);
        pool.give(b);
        pool.give(c);
        assert!(pool.is_full());
    }

    #[test]
    #[should_panic(expected = "given back twice")]
    fn double_give_is_caught() {
        let mut pool = BufPool::new(&[(4096, 1)]).unwrap();
        let a = pool.take(1).unwrap();
        let twin = IoBuf::with_class(4096, 0);
        pool.give(a);
        pool.give(twin);
    }

    #[test]
    fn bad_class_lists_are_refused() {
        assert_eq!(BufPool::new(&[]).unwrap_err(), PoolError::BadClasses);
        assert_eq!(BufPool::new(&[(1000, 1)]).unwrap_err(), PoolError::BadClasses);
        assert_eq!(BufPool::new(&[(8192, 1), (4096, 1)]).unwrap_err(), PoolError::BadClasses);
    }
}
