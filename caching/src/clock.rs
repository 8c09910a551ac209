//! A cheap event clock for the hot path.
//!
//! `crate::allocator` stamps every event it pushes into the ring with [`Clock::ticks`]; reading
//! the time stamp counter costs a few nanoseconds where `Instant::now()` costs tens. Ticks are
//! converted to nanoseconds only when a snapshot or the telemetry publisher reads the ring, using
//! the ratio of elapsed `Instant` time to elapsed ticks measured at that moment. Where the
//! processor has no invariant time stamp counter (or is not x86-64), ticks are nanoseconds from
//! `Instant`.

use std::time::Instant;

/// A monotonic clock whose readings are converted to nanoseconds lazily.
pub(crate) struct Clock {
    origin: Instant,
    tsc_origin: Option<u64>,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock {
            origin: Instant::now(),
            tsc_origin: tsc::read_if_invariant(),
        }
    }

    /// A reading in clock-specific ticks since the clock started.
    #[inline]
    pub fn ticks(&self) -> u64 {
        match self.tsc_origin {
            Some(origin) => tsc::read().wrapping_sub(origin),
            None => self.origin.elapsed().as_nanos() as u64,
        }
    }

    /// Nanoseconds per tick, measured over the clock's whole life so far.
    pub fn ns_per_tick(&self) -> f64 {
        match self.tsc_origin {
            Some(origin) => {
                let ticks = tsc::read().wrapping_sub(origin);
                let ns = self.origin.elapsed().as_nanos() as f64;
                if ticks == 0 {
                    1.0
                } else {
                    ns / ticks as f64
                }
            }
            None => 1.0,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod tsc {
    /// Reads the time stamp counter.
    #[inline]
    pub fn read() -> u64 {
        // SAFETY: RDTSC has no preconditions on x86-64; it only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    /// Reads the counter if the processor says it runs at a constant rate in every state.
    /// The answer is asked of the processor once per process: under a hypervisor `cpuid`
    /// traps, and cost tens of microseconds for every allocator made.
    pub fn read_if_invariant() -> Option<u64> {
        static INVARIANT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let invariant = *INVARIANT.get_or_init(|| {
            let max_extended = core::arch::x86_64::__cpuid(0x8000_0000).eax;
            max_extended >= 0x8000_0007
                && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
        });
        invariant.then(read)
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod tsc {
    pub fn read() -> u64 {
        0
    }

    pub fn read_if_invariant() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_elapsed_nanoseconds() {
        let clock = Clock::new();
        let start = clock.ticks();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let end = clock.ticks();
        assert!(end > start);
        let ns = (end - start) as f64 * clock.ns_per_tick();
        assert!((15e6..200e6).contains(&ns), "{ns} ns for a 20 ms sleep");
    }
}
