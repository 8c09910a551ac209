//! The lock the caching allocator's hot path takes, swappable for loom's model checker.
//!
//! `crate::caching` keeps each device's state behind one [`Mutex`]. In normal builds that is
//! `parking_lot::Mutex`; built with `RUSTFLAGS="--cfg loom"` it is loom's, so that
//! `tests/loom.rs` can explore every interleaving of allocations, frees and a consumer pulling
//! events from the ring by sequence number (`events_since`), as the telemetry publisher does.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

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
