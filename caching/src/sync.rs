//! The lock the caching allocator's hot path takes, swappable for loom's model checker.
//!
//! `crate::allocator` keeps each device's state behind one [`Mutex`]. In normal builds that is a
//! `parking_lot::Mutex` whose waiters spin before they park, looking at the lock ever more
//! rarely. A critical section of the allocator lasts a fraction of a microsecond: parking_lot's
//! own wait (a few `pause`s, then `sched_yield` calls, then a futex sleep) gave the core away,
//! at the cost of context switches and wake-up calls, for waits shorter than a switch; and a
//! waiter that looks often takes the lock in the holder's gap between two operations, so the
//! books' cache lines move between cores every few operations. docs/history/benchmarks.md
//! ("Threads on separate streams") has the measurements. Built with `RUSTFLAGS="--cfg loom"` it is loom's,
//! so that `tests/loom.rs` can explore every interleaving of allocations, frees and a consumer
//! pulling events from the ring by sequence number (`events_since`), as the telemetry publisher
//! does.

#[cfg(not(loom))]
pub(crate) use parking_lot::MutexGuard;
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(loom))]
use std::time::{Duration, Instant};

/// How long a thread spins on a held lock before it parks: long enough to ride out a
/// stretch of the holder's operations (each a fraction of a microsecond), short enough that a
/// lock held for long (a snapshot, `empty_cache`) soon stops costing a core.
#[cfg(not(loom))]
const SPIN_LIMIT: Duration = Duration::from_micros(200);

/// The first wait between two looks at a held lock; each wait doubles, up to [`LONGEST_LOOK`].
/// A short critical section is seen to end within a fraction of a microsecond.
#[cfg(not(loom))]
const FIRST_LOOK: Duration = Duration::from_nanos(100);

/// The longest wait between two looks at a held lock. Under steady contention (threads
/// allocating in a loop) the holder takes the lock back within nanoseconds of each release,
/// and a waiter that looked often would catch one of those gaps soon and move the books'
/// cache lines to its core after every few operations (two threads then ran at 0.6× of one);
/// looking rarely leaves the holder long runs, and the lock changes hands seldom.
#[cfg(not(loom))]
const LONGEST_LOOK: Duration = Duration::from_micros(30);

/// `pause` instructions between two readings of the clock while waiting.
#[cfg(not(loom))]
const PAUSES: u32 = 8;

/// How many threads may spin on one lock at a time: one fewer than the cores this process may
/// use, so that spinners never take the core the holder needs (with more threads than cores,
/// the others park at once). Read once.
#[cfg(not(loom))]
fn max_spinners() -> u32 {
    static MAX: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        u32::try_from(cores.saturating_sub(1)).unwrap_or(u32::MAX)
    })
}

/// `parking_lot`'s mutex, waiting for a held lock by spinning (looking at it ever more rarely,
/// up to [`SPIN_LIMIT`], at most [`max_spinners`] threads at a time) before parking.
#[cfg(not(loom))]
pub(crate) struct Mutex<T> {
    inner: parking_lot::Mutex<T>,
    /// Threads spinning on the lock now.
    spinners: AtomicU32,
}

#[cfg(not(loom))]
impl<T> Mutex<T> {
    /// A new mutex holding `value`.
    pub(crate) fn new(value: T) -> Mutex<T> {
        Mutex {
            inner: parking_lot::Mutex::new(value),
            spinners: AtomicU32::new(0),
        }
    }

    /// Locks the mutex: at once if it is free, else after spinning, else after parking.
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        match self.inner.try_lock() {
            Some(guard) => guard,
            None => self.lock_contended(),
        }
    }

    /// Locks the mutex if it is free.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.inner.try_lock()
    }

    /// The wait for a held lock: spin if fewer than [`max_spinners`] threads do, then park
    /// through `parking_lot`.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> MutexGuard<'_, T> {
        let spun = if self.spinners.fetch_add(1, Ordering::Relaxed) < max_spinners() {
            self.spin()
        } else {
            None
        };
        self.spinners.fetch_sub(1, Ordering::Relaxed);
        spun.unwrap_or_else(|| self.inner.lock())
    }

    /// Spins for the lock: looks at the lock word (a read, which leaves the holder's cache line
    /// alone) after waits that double from [`FIRST_LOOK`] to [`LONGEST_LOOK`], and tries to
    /// take it when it reads free; gives up after [`SPIN_LIMIT`].
    fn spin(&self) -> Option<MutexGuard<'_, T>> {
        let start = Instant::now();
        let mut wait = FIRST_LOOK;
        loop {
            if !self.inner.is_locked() {
                if let Some(guard) = self.inner.try_lock() {
                    return Some(guard);
                }
            }
            let looked = Instant::now();
            if looked - start > SPIN_LIMIT {
                return None;
            }
            while looked.elapsed() < wait {
                for _ in 0..PAUSES {
                    std::hint::spin_loop();
                }
            }
            wait = (wait * 2).min(LONGEST_LOOK);
        }
    }
}

/// The guard of a locked [`Mutex`].
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

/// loom's mutex with `parking_lot`'s interface (a lock that cannot be poisoned in a model).
#[cfg(loom)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    /// A new mutex holding `value`.
    pub(crate) fn new(value: T) -> Mutex<T> {
        Mutex(loom::sync::Mutex::new(value))
    }

    /// Locks the mutex.
    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock().expect("a loom model does not poison locks")
    }

    /// Locks the mutex if it is free.
    pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn contended_increments_are_all_counted() {
        let counter = Mutex::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..20_000 {
                        // A read and a write apart: a second holder in between would lose one.
                        let mut guard = counter.lock();
                        let seen = *guard;
                        std::hint::black_box(&seen);
                        *guard = seen + 1;
                    }
                });
            }
        });
        assert_eq!(*counter.lock(), 80_000);
    }

    #[test]
    fn a_waiter_past_the_spin_limit_parks_and_gets_the_lock_after_its_release() {
        let value = Mutex::new(0u32);
        std::thread::scope(|scope| {
            let mut guard = value.lock();
            let waiter = scope.spawn(|| {
                let mut guard = value.lock();
                let seen = *guard;
                *guard += 1;
                seen
            });
            // Held for many spin limits: the waiter has to give up spinning and park.
            std::thread::sleep(SPIN_LIMIT * 20);
            *guard = 10;
            drop(guard);
            assert_eq!(
                waiter.join().unwrap(),
                10,
                "the waiter ran after the holder"
            );
        });
        assert_eq!(*value.lock(), 11);
    }
}
