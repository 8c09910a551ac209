//! The cached fast path: one alloc+free pair of a size already in the cache, with tracking off,
//! with call sites and events on, and with backtraces sampled one in 64.

// criterion_group! generates a public function without documentation.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use vramscope_allocator::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::AllocatorConfig;

fn configs() -> Vec<(&'static str, AllocatorConfig)> {
    vec![
        ("tracking_off", AllocatorConfig::default().untracked()),
        ("sites_and_events", AllocatorConfig::default()),
        (
            "backtraces_1_in_64",
            AllocatorConfig::parse("backtraces:64").unwrap(),
        ),
    ]
}

fn alloc_free_pair(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_pair");
    for (name, config) in configs() {
        for size in [4u64 << 10, 8 << 20] {
            let alloc = CachingAllocator::new(SimDevice::phantom(1 << 40), config.clone());
            // Warm the cache so the pair never touches the device.
            drop(alloc.alloc(size).unwrap());
            let label = if size < 1 << 20 { "4KiB" } else { "8MiB" };
            group.bench_with_input(BenchmarkId::new(name, label), &size, |b, &size| {
                b.iter(|| {
                    let buffer = alloc.alloc(black_box(size)).unwrap();
                    drop(black_box(buffer));
                })
            });
            group.bench_with_input(
                BenchmarkId::new(format!("{name}/raw_ptr"), label),
                &size,
                |b, &size| {
                    b.iter(|| {
                        let ptr = alloc.alloc_ptr(black_box(size), StreamId::DEFAULT).unwrap();
                        alloc.free_ptr(black_box(ptr)).unwrap();
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1));
    targets = alloc_free_pair
}
criterion_main!(benches);
