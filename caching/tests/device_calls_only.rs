//! An allocator that records device calls only (`CachingAllocator::recording_device_calls`,
//! the ring of a replay that compares device calls) against one that records every event, run
//! through the same random programs side by side: the policy, the statistics and the device
//! calls are the same, and its ring holds exactly the other's events without the allocations
//! and frees.

use proptest::prelude::*;
use vramscope_caching::{Backend, CachingAllocator, DeviceBuffer, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, Event, EventKind};

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: usize },
    Free { index: usize },
    RecordStream { index: usize, stream: usize },
    CompleteEvents,
    EmptyCache,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1u64..(1 << 20),
        2 => (1u64 << 20)..(12 << 20),
        1 => (12u64 << 20)..(48 << 20),
    ];
    prop_oneof![
        8 => (size, 0usize..2).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => (any::<usize>(), 0usize..2).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
    ]
}

/// One allocator of the pair, with its device and live buffers.
struct Side {
    device: SimDevice,
    streams: [StreamId; 2],
    alloc: CachingAllocator<SimDevice>,
    live: Vec<DeviceBuffer<SimDevice>>,
}

impl Side {
    fn new(conf: &str, device_calls_only: bool) -> Side {
        // A small device, so that some programs run out of memory and release cached blocks.
        let device = SimDevice::phantom(192 << 20);
        device.set_manual_events(true);
        let streams = [StreamId::DEFAULT, device.create_stream().unwrap()];
        let config = AllocatorConfig::parse(conf).unwrap();
        let alloc = if device_calls_only {
            CachingAllocator::recording_device_calls(device.clone(), config)
        } else {
            CachingAllocator::new(device.clone(), config)
        };
        Side {
            device,
            streams,
            alloc,
            live: Vec::new(),
        }
    }

    /// Runs `op`; whether an allocation succeeded, and the address it got.
    fn run(&mut self, op: &Op) -> Option<Result<u64, String>> {
        match op {
            Op::Alloc { size, stream } => {
                Some(match self.alloc.alloc_on(*size, self.streams[*stream]) {
                    Ok(buffer) => {
                        let addr = buffer.addr();
                        self.live.push(buffer);
                        Ok(addr)
                    }
                    Err(error) => Err(error.to_string()),
                })
            }
            Op::Free { index } => {
                if !self.live.is_empty() {
                    let at = index % self.live.len();
                    self.live.swap_remove(at).free().unwrap();
                }
                None
            }
            Op::RecordStream { index, stream } => {
                if !self.live.is_empty() {
                    let at = index % self.live.len();
                    self.live[at].record_stream(self.streams[*stream]).unwrap();
                }
                None
            }
            Op::CompleteEvents => {
                self.device.complete_all_events();
                None
            }
            Op::EmptyCache => {
                self.alloc.empty_cache();
                None
            }
        }
    }

    /// The events in the ring, as (kind, address, size, stream).
    fn events(&self) -> Vec<(EventKind, u64, u64, u64)> {
        let key = |e: &Event| (e.kind, e.addr, e.size, e.stream);
        self.alloc
            .events_since(0, usize::MAX)
            .events
            .iter()
            .map(key)
            .collect()
    }
}

fn is_block_event(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted
    )
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..vramscope_testkit::props::config(128) })]

    #[test]
    fn recording_device_calls_only_leaves_out_the_block_events_and_nothing_else(
        conf in prop_oneof![
            Just(""),
            Just("expandable_segments:True"),
            Just("max_split_size_mb:20,garbage_collection_threshold:0.6"),
        ],
        ops in proptest::collection::vec(op_strategy(), 1..120),
    ) {
        let conf = format!("{conf}{}record_events:True", if conf.is_empty() { "" } else { "," });
        let mut every = Side::new(&conf, false);
        let mut calls_only = Side::new(&conf, true);
        for (step, op) in ops.iter().enumerate() {
            let a = every.run(op);
            let b = calls_only.run(op);
            prop_assert_eq!(a, b, "step {} ({:?})", step, op);
        }
        prop_assert_eq!(every.alloc.stats(), calls_only.alloc.stats());
        prop_assert_eq!(
            every.device.counters().outstanding_bytes,
            calls_only.device.counters().outstanding_bytes
        );
        let expected: Vec<_> = every
            .events()
            .into_iter()
            .filter(|e| !is_block_event(e.0))
            .collect();
        let recorded = calls_only.events();
        prop_assert!(recorded.iter().all(|e| !is_block_event(e.0)));
        prop_assert_eq!(recorded, expected);
        // The other allocator did record allocations, so the comparison above left some out.
        let allocated = ops.iter().any(|op| matches!(op, Op::Alloc { .. }));
        prop_assert!(!allocated || every.events().iter().any(|e| e.0 == EventKind::Alloc));
    }
}
