//! Random operation programs (proptest): allocations (buffers, and block handles under the held
//! device lock), frees, `record_stream`, `empty_cache`, `mark_step` and injected raw-allocation
//! failures, with the allocator's books checked after every step and zero outstanding device
//! bytes after the allocator is dropped.

use proptest::prelude::*;
use vramscope_caching::{
    AllocError, Backend, BlockHandle, CachingAllocator, DeviceBuffer, SimDevice, StreamId,
};
use vramscope_model::AllocatorConfig;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: usize,
    },
    Free {
        index: usize,
    },
    /// An allocation through the handle API, under the held device lock.
    AllocBlock {
        size: u64,
        stream: usize,
    },
    /// A free of a handle, under the held device lock.
    FreeBlock {
        index: usize,
    },
    RecordStream {
        index: usize,
        stream: usize,
    },
    CompleteEvents,
    EmptyCache,
    MarkStep,
    FailNextRawAlloc,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        3 => 4096u64..(1 << 20),
        2 => (1u64 << 20)..(12 << 20),
        1 => (12u64 << 20)..(48 << 20),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (size_strategy(), 0usize..2).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|index| Op::Free { index }),
        3 => (size_strategy(), 0usize..2).prop_map(|(size, stream)| Op::AllocBlock { size, stream }),
        2 => any::<usize>().prop_map(|index| Op::FreeBlock { index }),
        1 => (any::<usize>(), 0usize..2).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::MarkStep),
        1 => Just(Op::FailNextRawAlloc),
    ]
}

fn config_strategy() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(""),
        Just("max_split_size_mb:24"),
        Just("expandable_segments:True"),
        Just("roundup_power2_divisions:4"),
        Just("garbage_collection_threshold:0.6"),
        Just("max_split_size_mb:20,expandable_segments:True,max_entries:64"),
        Just("policy:compact"),
    ]
}

fn run_program(conf: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let device = SimDevice::phantom(256 << 20);
    device.set_manual_events(true);
    let streams = [StreamId::DEFAULT, device.create_stream().unwrap()];
    {
        let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::parse(conf).unwrap());
        let mut live: Vec<DeviceBuffer<SimDevice>> = Vec::new();
        let mut handles: Vec<(BlockHandle, u64)> = Vec::new();
        for (step, op) in ops.iter().enumerate() {
            match op {
                Op::Alloc { size, stream } => match alloc.alloc_on(*size, streams[*stream]) {
                    Ok(buffer) => {
                        prop_assert!(buffer.addr() % 512 == 0);
                        live.push(buffer);
                    }
                    Err(AllocError::OutOfMemory(report)) => {
                        prop_assert_eq!(report.requested, *size);
                        prop_assert!(report.to_string().contains("out of memory"));
                    }
                    Err(other) => return Err(TestCaseError::fail(format!("step {step}: {other}"))),
                },
                Op::Free { index } => {
                    if !live.is_empty() {
                        let buffer = live.swap_remove(index % live.len());
                        buffer
                            .free()
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                }
                Op::AllocBlock { size, stream } => {
                    match alloc.exclusive().alloc_block(*size, streams[*stream]) {
                        Ok(handle) => {
                            prop_assert!(handle.addr() % 512 == 0);
                            handles.push((handle, *size));
                        }
                        Err(AllocError::OutOfMemory(report)) => {
                            prop_assert_eq!(report.requested, *size);
                        }
                        Err(other) => {
                            return Err(TestCaseError::fail(format!("step {step}: {other}")))
                        }
                    }
                }
                Op::FreeBlock { index } => {
                    if !handles.is_empty() {
                        let (handle, _) = handles.swap_remove(index % handles.len());
                        alloc
                            .exclusive()
                            .free_block(handle)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                }
                Op::RecordStream { index, stream } => {
                    if !live.is_empty() {
                        live[index % live.len()]
                            .record_stream(streams[*stream])
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                }
                Op::CompleteEvents => device.complete_all_events(),
                Op::EmptyCache => {
                    alloc.empty_cache();
                }
                Op::MarkStep => {
                    alloc.mark_step();
                }
                Op::FailNextRawAlloc => device.fail_nth_raw_alloc(1),
            }
            if let Err(problem) = alloc.check_invariants() {
                return Err(TestCaseError::fail(format!(
                    "after step {step} ({op:?}): {problem}"
                )));
            }
            // Live buffers never overlap.
            let mut ranges: Vec<(u64, u64)> = live
                .iter()
                .filter(|b| !b.is_empty())
                .map(|b| (b.addr(), b.addr() + b.len()))
                .chain(
                    handles
                        .iter()
                        .filter(|(h, _)| h.addr() != 0)
                        .map(|(h, size)| (h.addr(), h.addr() + size)),
                )
                .collect();
            ranges.sort_unstable();
            for pair in ranges.windows(2) {
                prop_assert!(pair[0].1 <= pair[1].0, "overlap {:?}", pair);
            }
            let stats = alloc.stats();
            let requested: u64 = live.iter().map(|b| b.len()).sum::<u64>()
                + handles.iter().map(|(_, size)| size).sum::<u64>();
            if stats.active.all.current == stats.allocation.all.current {
                prop_assert_eq!(stats.requested_bytes.all.current, requested);
            } else {
                // Frees waiting on stream events still count (exactly: `check_invariants`).
                prop_assert!(stats.requested_bytes.all.current > requested);
            }
            prop_assert_eq!(
                stats.reserved_bytes.all.current,
                device.counters().outstanding_bytes,
                "reserved equals what the device handed out"
            );
        }
        device.clear_faults();
        // After everything is freed, the next allocation works.
        drop(live);
        for (handle, _) in handles {
            alloc
                .free_block(handle)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        device.complete_all_events();
        let again = alloc.alloc(4096);
        prop_assert!(again.is_ok());
    }
    prop_assert_eq!(device.counters().outstanding_bytes, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..vramscope_testkit::props::config(256) })]

    #[test]
    fn random_programs_keep_the_books_straight(
        conf in config_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        run_program(conf, &ops)?;
    }
}

#[test]
fn random_fault_injection_never_corrupts_state() {
    let device = SimDevice::phantom(1 << 30);
    device.fail_raw_allocs_randomly(0.25, 7);
    let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::default());
    let mut live = Vec::new();
    let mut failures = 0;
    for i in 0..2000u64 {
        let size = (i * 7919) % (30 << 20) + 1;
        match alloc.alloc(size) {
            Ok(b) => live.push(b),
            Err(AllocError::OutOfMemory(_)) => failures += 1,
            Err(e) => panic!("{e}"),
        }
        if i % 3 == 0 && !live.is_empty() {
            live.swap_remove((i as usize * 31) % live.len());
        }
        if i % 97 == 0 {
            alloc.empty_cache();
        }
    }
    alloc.check_invariants().unwrap();
    assert!(failures > 0, "faults were injected");
    assert_eq!(alloc.stats().num_ooms, failures);
    drop(live);
    drop(alloc);
    assert_eq!(device.counters().outstanding_bytes, 0);
}

/// Runs `threads` threads of `ops` operations each on `alloc`: operation `i` of thread `t`
/// gets a buffer from `make(t, i)`; every other buffer goes to whichever thread frees next
/// (a cross-thread free), the rest stay with their thread, which frees the oldest half of
/// them once it holds more than `keep`; each thread frees one buffer sent by another per
/// operation, then calls `after(i)`. Every buffer is freed by the time it returns.
fn run_threads_passing_frees(
    threads: u64,
    ops: u64,
    keep: usize,
    make: impl Fn(u64, u64) -> DeviceBuffer<SimDevice> + Sync,
    after: impl Fn(u64) + Sync,
) {
    let (tx, rx) = std::sync::mpsc::channel::<DeviceBuffer<SimDevice>>();
    let rx = std::sync::Arc::new(parking_lot::Mutex::new(rx));
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (tx, rx, make, after) = (tx.clone(), rx.clone(), &make, &after);
            scope.spawn(move || {
                let mut mine = Vec::new();
                for i in 0..ops {
                    let buffer = make(t, i);
                    if i % 2 == 0 {
                        tx.send(buffer).unwrap();
                    } else {
                        mine.push(buffer);
                    }
                    if mine.len() > keep {
                        mine.drain(..keep / 2);
                    }
                    // Free what other threads sent.
                    if let Ok(theirs) = rx.lock().try_recv() {
                        drop(theirs);
                    }
                    after(i);
                }
            });
        }
    });
    drop(tx);
    while let Ok(buffer) = rx.lock().try_recv() {
        drop(buffer);
    }
}

#[test]
fn four_threads_with_cross_thread_frees_keep_the_books_straight() {
    let device = SimDevice::phantom(4 << 30);
    let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::default());
    run_threads_passing_frees(
        4,
        3000,
        20,
        |t, i| {
            let size = match (i + t) % 4 {
                0 => 64 + i % 4000,
                1 => 100_000 + i * 13 % 900_000,
                2 => (2 << 20) + i * 4099 % (8 << 20),
                _ => 512,
            };
            alloc.alloc(size).unwrap()
        },
        |i| {
            if i % 500 == 0 {
                alloc.mark_step();
            }
        },
    );
    alloc.check_invariants().unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.allocation.all.current, 0);
    assert_eq!(stats.allocation.all.allocated, 12_000);
    alloc.empty_cache();
    assert_eq!(device.counters().outstanding_bytes, 0);
}

#[test]
fn eight_threads_with_record_stream_and_empty_cache_keep_the_books_straight() {
    let device = SimDevice::phantom(8 << 30);
    device.set_manual_events(true);
    let side = device.create_stream().unwrap();
    let alloc = CachingAllocator::new(
        device.clone(),
        AllocatorConfig::parse("max_split_size_mb:64").unwrap(),
    );
    run_threads_passing_frees(
        8,
        1500,
        12,
        |t, i| {
            let size = match (i * 7 + t) % 5 {
                0 => 1 + i % 2000,
                1 => 300_000 + i * 17 % 700_000,
                2 => (1 << 20) + i * 4099 % (9 << 20),
                3 => (12 << 20) + i % 5 * (16 << 20),
                _ => 512,
            };
            let stream = if (i + t) % 3 == 0 {
                side
            } else {
                StreamId::DEFAULT
            };
            let buffer = alloc.alloc_on(size, stream).unwrap();
            if i % 4 == 0 {
                buffer.record_stream(side).unwrap();
            }
            buffer
        },
        |i| match i % 200 {
            50 => {
                alloc.empty_cache();
            }
            100 => device.complete_stream(side),
            150 => {
                alloc.mark_step();
            }
            _ => {}
        },
    );
    alloc.check_invariants().unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.allocation.all.current, 0);
    assert_eq!(stats.allocation.all.allocated, 8 * 1500);
    device.complete_all_events();
    alloc.empty_cache();
    alloc.check_invariants().unwrap();
    assert_eq!(
        alloc.stats().active.all.current,
        0,
        "deferred frees completed"
    );
    assert_eq!(device.counters().outstanding_bytes, 0);
}
