//! Timed replays: one allocator over one trace, many threads over one vramscope allocator, and
//! the cached alloc+free pair loop.
//!
//! A replay's clock covers only the trace's operations. Building the allocator, the handle
//! table and freeing what the trace leaves live at its end happen outside it.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use vramscope_allocator::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::AllocatorConfig;

use crate::peers::{DeviceAllocator, Footprint, DEVICE_CAPACITY};
use crate::trace::{Op, Trace};

/// What one replay measured.
#[derive(Clone, Copy, Debug)]
pub struct Replay {
    /// Time spent in the trace's operations.
    pub elapsed: Duration,
    /// Operations replayed (allocations and frees).
    pub ops: usize,
    /// Allocations that failed.
    pub ooms: u64,
    /// Device books after the replay.
    pub footprint: Footprint,
}

impl Replay {
    /// Nanoseconds per operation.
    pub fn ns_per_op(&self) -> f64 {
        self.elapsed.as_nanos() as f64 / self.ops.max(1) as f64
    }
}

/// Replays `trace` through `alloc`: each allocation's handle goes into its slot, each free
/// takes it back out. A free whose allocation failed is skipped.
pub fn replay<A: DeviceAllocator>(alloc: &mut A, trace: &Trace) -> Replay {
    let mut handles: Vec<Option<A::Handle>> = Vec::with_capacity(trace.slots);
    handles.resize_with(trace.slots, || None);
    let start = Instant::now();
    let ooms = run_ops(alloc, &trace.ops, &mut handles);
    let elapsed = start.elapsed();
    let footprint = alloc.footprint();
    for handle in handles.iter_mut() {
        if let Some(handle) = handle.take() {
            alloc.free(handle);
        }
    }
    Replay {
        elapsed,
        ops: trace.ops.len(),
        ooms,
        footprint,
    }
}

/// The timed loop of [`replay`], kept out of line so that callgrind can count exactly its
/// instructions (`--toggle-collect='*run_ops*'`). Returns the failed allocations.
#[inline(never)]
pub fn run_ops<A: DeviceAllocator>(
    alloc: &mut A,
    ops: &[Op],
    handles: &mut [Option<A::Handle>],
) -> u64 {
    let mut ooms = 0;
    for op in ops {
        match *op {
            Op::Alloc { slot, size, stream } => match alloc.alloc(size, stream) {
                Some(handle) => handles[slot as usize] = Some(handle),
                None => ooms += 1,
            },
            Op::Free { slot } => {
                if let Some(handle) = handles[slot as usize].take() {
                    alloc.free(handle);
                }
            }
        }
    }
    ooms
}

/// What a multi-threaded run measured.
#[derive(Clone, Copy, Debug)]
pub struct Threaded {
    /// From the common start to the last thread's end.
    pub wall: Duration,
    /// Operations done by all threads together.
    pub ops: usize,
    /// Mean over threads of each thread's wall-clock nanoseconds per operation.
    pub wall_ns_per_op: f64,
    /// Mean over threads of each thread's CPU nanoseconds per operation (time on a CPU,
    /// spinning included; time parked on the lock or preempted excluded).
    pub cpu_ns_per_op: f64,
    /// Voluntary context switches of all threads (parking on the lock's futex, mostly).
    pub voluntary_switches: u64,
    /// Involuntary context switches of all threads (preemption by other work).
    pub involuntary_switches: u64,
}

impl Threaded {
    /// Operations per second, all threads together, in millions.
    pub fn mops(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64() / 1e6
    }

    fn from_threads(wall: Duration, per_thread: &[ThreadTimes], ops_each: usize) -> Self {
        let n = per_thread.len() as f64;
        let mean = |f: fn(&ThreadTimes) -> Duration| {
            per_thread
                .iter()
                .map(|t| f(t).as_nanos() as f64 / ops_each as f64)
                .sum::<f64>()
                / n
        };
        Threaded {
            wall,
            ops: ops_each * per_thread.len(),
            wall_ns_per_op: mean(|t| t.wall),
            cpu_ns_per_op: mean(|t| t.cpu),
            voluntary_switches: per_thread.iter().map(|t| t.voluntary).sum(),
            involuntary_switches: per_thread.iter().map(|t| t.involuntary).sum(),
        }
    }
}

/// One thread's times and context switches over its work.
#[derive(Clone, Copy, Debug)]
struct ThreadTimes {
    /// When the thread started its work.
    start: Instant,
    wall: Duration,
    cpu: Duration,
    voluntary: u64,
    involuntary: u64,
}

/// The calling thread's (voluntary, involuntary) context switches so far.
fn thread_switches() -> (u64, u64) {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage and RUSAGE_THREAD is supported on Linux;
    // on failure `usage` stays zero, which only zeroes the figures.
    unsafe {
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
    }
    (usage.ru_nvcsw as u64, usage.ru_nivcsw as u64)
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_THREAD_CPUTIME_ID is supported on
    // every Linux this runs on; on failure `ts` stays zero, which only zeroes the figure.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `work` on `threads` threads that start together. Gives the wall time from the first
/// thread's start to the last one's end, and each thread's times and context switches. (Timed
/// by the workers themselves: the spawning thread may be held off a busy core until they end.)
fn run_threads<F>(threads: usize, work: F) -> (Duration, Vec<ThreadTimes>)
where
    F: Fn(usize) + Sync,
{
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    barrier.wait();
                    let (start, cpu, switches) =
                        (Instant::now(), thread_cpu_time(), thread_switches());
                    work(t);
                    let (wall, cpu_end, switches_end) =
                        (start.elapsed(), thread_cpu_time(), thread_switches());
                    ThreadTimes {
                        start,
                        wall,
                        cpu: cpu_end - cpu,
                        voluntary: switches_end.0 - switches.0,
                        involuntary: switches_end.1 - switches.1,
                    }
                })
            })
            .collect();
        barrier.wait();
        let per_thread: Vec<ThreadTimes> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let first = per_thread.iter().map(|t| t.start).min();
        let last = per_thread.iter().map(|t| t.start + t.wall).max();
        let wall = match (first, last) {
            (Some(first), Some(last)) => last - first,
            _ => Duration::ZERO,
        };
        (wall, per_thread)
    })
}

/// Each of `threads` threads replays `trace` `rounds` times on its own stream (`1 + thread`)
/// of one shared vramscope allocator with `config`, all starting together. Each round frees
/// what the trace leaves live, so the allocator's cache is warm from the second round on.
pub fn replay_threads(
    trace: &Trace,
    config: &AllocatorConfig,
    threads: usize,
    rounds: usize,
) -> Threaded {
    let alloc = CachingAllocator::new(SimDevice::phantom(DEVICE_CAPACITY), config.clone());
    let live_at_end = trace.allocs - trace.frees;
    let (wall, per_thread) = run_threads(threads, |t| {
        let stream = StreamId(1 + t as u64);
        let mut handles = vec![0u64; trace.slots];
        for _ in 0..rounds {
            for op in &trace.ops {
                match *op {
                    Op::Alloc { slot, size, .. } => {
                        handles[slot as usize] = alloc.alloc_ptr(size, stream).unwrap_or(0);
                    }
                    Op::Free { slot } => {
                        let addr = std::mem::take(&mut handles[slot as usize]);
                        if addr != 0 {
                            let _ = alloc.free_ptr(addr);
                        }
                    }
                }
            }
            for addr in handles.iter_mut().filter(|a| **a != 0) {
                let _ = alloc.free_ptr(std::mem::take(addr));
            }
        }
    });
    let ops_each = (trace.ops.len() + live_at_end) * rounds;
    Threaded::from_threads(wall, &per_thread, ops_each)
}

/// Each of `threads` threads does `pairs` cached 4 KiB alloc+free pairs on its own stream of
/// one shared vramscope allocator with `config` (one warm-up pair per stream first).
pub fn pairs_threads(config: &AllocatorConfig, threads: usize, pairs: u64) -> Threaded {
    let alloc = CachingAllocator::new(SimDevice::phantom(DEVICE_CAPACITY), config.clone());
    for t in 0..threads {
        let warm = alloc.alloc_ptr(4096, StreamId(1 + t as u64)).unwrap();
        alloc.free_ptr(warm).unwrap();
    }
    let (wall, per_thread) = run_threads(threads, |t| {
        let stream = StreamId(1 + t as u64);
        for _ in 0..pairs {
            let addr = alloc.alloc_ptr(std::hint::black_box(4096), stream).unwrap();
            alloc.free_ptr(std::hint::black_box(addr)).unwrap();
        }
    });
    Threaded::from_threads(wall, &per_thread, (pairs * 2) as usize)
}

/// What the threads of [`pairs_apart`] share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    /// Nothing: each thread has an allocator of its own (the most that books kept apart per
    /// stream could give).
    Nothing,
    /// One counter of allocated bytes with an exact peak, besides an allocator each: every
    /// allocation adds to it and every free takes from it, in one order of all threads' changes,
    /// which is the least an exact all-streams statistic costs on top of books kept apart.
    ExactCounter,
}

/// One cache line of its own for a shared counter, so that the counter's transfers between
/// cores are its own and not those of its neighbours.
#[repr(align(128))]
struct Line(std::sync::atomic::AtomicU64);

/// Each of `threads` threads does `pairs` cached 4 KiB alloc+free pairs on an allocator of its
/// own with `config`, sharing only what `shared` says: the bound on what splitting one
/// allocator's books by stream could give, and what an exact shared statistic costs on top.
pub fn pairs_apart(
    config: &AllocatorConfig,
    threads: usize,
    pairs: u64,
    shared: Shared,
) -> Threaded {
    use std::sync::atomic::Ordering;
    let allocators: Vec<CachingAllocator<SimDevice>> = (0..threads)
        .map(|_| {
            let alloc = CachingAllocator::new(SimDevice::phantom(DEVICE_CAPACITY), config.clone());
            let warm = alloc.alloc_ptr(4096, StreamId(1)).unwrap();
            alloc.free_ptr(warm).unwrap();
            alloc
        })
        .collect();
    let (current, peak) = (Line(0.into()), Line(0.into()));
    let (wall, per_thread) = run_threads(threads, |t| {
        let alloc = &allocators[t];
        let size = std::hint::black_box(4096u64);
        for _ in 0..pairs {
            let addr = alloc.alloc_ptr(size, StreamId(1)).unwrap();
            if shared == Shared::ExactCounter {
                // Every value the counter takes is one of a single order of all changes, so
                // the largest of them is the exact peak; the peak is written only when raised.
                let now = current.0.fetch_add(size, Ordering::AcqRel) + size;
                if now > peak.0.load(Ordering::Relaxed) {
                    peak.0.fetch_max(now, Ordering::AcqRel);
                }
            }
            alloc.free_ptr(std::hint::black_box(addr)).unwrap();
            if shared == Shared::ExactCounter {
                current.0.fetch_sub(size, Ordering::AcqRel);
            }
        }
    });
    assert!(peak.0.load(Ordering::Relaxed) <= 4096 * threads as u64);
    Threaded::from_threads(wall, &per_thread, (pairs * 2) as usize)
}

/// `pairs` alloc+free pairs of 4 KiB through any allocator after one warm-up pair; nanoseconds
/// per operation (half a pair).
pub fn pairs<A: DeviceAllocator>(alloc: &mut A, pairs: u64) -> f64 {
    let warm = alloc.alloc(4096, 0).expect("warm-up allocation");
    alloc.free(warm);
    let start = Instant::now();
    for _ in 0..pairs {
        let handle = alloc
            .alloc(std::hint::black_box(4096), 0)
            .expect("cached allocation");
        alloc.free(std::hint::black_box(handle));
    }
    start.elapsed().as_nanos() as f64 / (pairs * 2) as f64
}

/// The median of `values` (which must not be empty).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}
