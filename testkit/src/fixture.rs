//! Fixed, realistic data for the dashboard's screen tests, examples and benchmarks, and for
//! every other test that wants a real run with stable text.
//!
//! [`training_snapshot`] runs a small training loop through the real caching allocator on the
//! simulated device (weights, optimizer state, activations, a loss kept every step, a value read
//! back to the host many times per step, a burst of small blocks), then replaces everything
//! that varies between runs (times, thread numbers, and the Rust call sites, which move when
//! code is edited) with fixed values: Python-like stacks that mix user code with framework
//! frames, so that every panel of the dashboard (`vramscope_tui::ui`) has something to show and
//! its text is the same on every machine. [`many_blocks_snapshot`] builds a state with a given number of live blocks for
//! the drawing benchmark.

use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_model::{AllocatorConfig, CallSite, EventKind, Frame, Id, Snapshot};

const MIB: u64 = 1 << 20;

/// Event times of the fixture: one event every 1.25 ms.
const NS_PER_EVENT: u64 = 1_250_000;
/// The fixture's wall-clock epoch: 2023-11-14 22:13:20 UTC.
pub const EPOCH_UNIX_NS: u64 = 1_700_000_000_000_000_000;

fn frame(file: &str, line: u32, function: &str) -> Frame {
    Frame {
        file: file.to_string(),
        line,
        function: function.to_string(),
    }
}

/// The fixed call sites, in the order the workload first uses its sites.
fn fixed_sites() -> Vec<CallSite> {
    let site = |frames: Vec<Frame>, primary: usize| {
        let p = &frames[primary];
        CallSite {
            file: p.file.clone(),
            line: p.line,
            column: 0,
            function: p.function.clone(),
            frames,
        }
    };
    let main = frame("train.py", 140, "main");
    let module = frame("torch/nn/modules/module.py", 1501, "_call_impl");
    vec![
        site(
            vec![
                frame("torch/nn/modules/module.py", 1160, "to"),
                frame("model.py", 31, "__init__"),
                main.clone(),
            ],
            1,
        ),
        site(
            vec![
                frame("torch/optim/adam.py", 88, "_init_group"),
                frame("torch/optim/optimizer.py", 373, "step"),
                frame("train.py", 96, "train_step"),
                main.clone(),
            ],
            2,
        ),
        site(vec![frame("train.py", 71, "train_step"), main.clone()], 0),
        site(
            vec![
                frame("torch/nn/functional.py", 1704, "gelu"),
                frame("model.py", 54, "forward"),
                module.clone(),
                frame("train.py", 74, "train_step"),
                main.clone(),
            ],
            1,
        ),
        site(
            vec![
                frame("torch/nn/functional.py", 3053, "cross_entropy"),
                frame("train.py", 77, "train_step"),
                main.clone(),
            ],
            1,
        ),
        site(
            vec![
                frame("torch/_tensor.py", 1034, "item"),
                frame("train.py", 83, "train_step"),
                main.clone(),
            ],
            1,
        ),
        site(
            vec![
                frame("torch/autograd/graph.py", 744, "_engine_run_backward"),
                frame("torch/_tensor.py", 522, "backward"),
                frame("train.py", 80, "train_step"),
                main.clone(),
            ],
            2,
        ),
        site(
            vec![
                frame("data.py", 22, "collate"),
                frame("torch/utils/data/dataloader.py", 631, "__next__"),
                frame("train.py", 68, "train_step"),
                main.clone(),
            ],
            0,
        ),
        site(vec![frame("train.py", 90, "log_metrics"), main], 0),
    ]
}

/// A training run of `steps` steps with a retained loss and a sync in a loop, on a 16 GiB
/// simulated device, with fixed times and call sites. See the module documentation.
pub fn training_snapshot_with(steps: u64) -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::backed(16 << 30), AllocatorConfig::default());
    let run = || -> Result<Snapshot, vramscope_allocator::AllocError> {
        let _weights = alloc.tagged("weights").alloc(12 * MIB)?;
        let _adam = alloc.tagged("adam").alloc(24 * MIB)?;
        let mut kept = Vec::new();
        let mut small = Vec::new();
        for step in 0..steps {
            alloc.mark_step();
            let mut acts = Vec::new();
            {
                let _scope = alloc.scope("forward");
                for _ in 0..3 {
                    acts.push(alloc.tagged("activation").alloc(3 * MIB)?);
                }
            }
            let loss = alloc.tagged("loss").alloc(MIB + 512)?;
            for _ in 0..10 {
                let mut value = [0u8; 4];
                loss.copy_to_host(&mut value)?;
            }
            {
                let _scope = alloc.scope("backward");
                while let Some(a) = acts.pop() {
                    let _grad = alloc.alloc(a.len())?;
                }
            }
            for i in 0..6 {
                let batch = alloc.tagged("batch").alloc(48 << 10)?;
                if (i + step) % 3 == 0 {
                    small.push(batch);
                }
            }
            let _metrics = alloc.alloc(4 << 10)?;
            kept.push(loss);
        }
        // The snapshot is taken while the weights, the kept losses and batches are alive.
        Ok(alloc.snapshot())
    };
    // The fixed workload fits the device; a failure would only shorten the trace.
    let mut snapshot = run().unwrap_or_else(|_| alloc.snapshot());
    normalize(&mut snapshot);
    snapshot
}

/// [`training_snapshot_with`] for eight steps.
pub fn training_snapshot() -> Snapshot {
    training_snapshot_with(8)
}

/// Makes `snapshot` a trace that lost frees, as a recorder that dropped events gives: for the
/// first `addresses` addresses allocated more than once, the free requests and completions
/// that another allocation at the address follows are removed (the last allocation's free is
/// kept, so the dump-time state still holds). Returns how many events went.
pub fn lose_frees(snapshot: &mut Snapshot, addresses: usize) -> usize {
    let events = snapshot.events.to_vec();
    let allocated_later = |i: usize, addr: u64| {
        events[i + 1..]
            .iter()
            .any(|l| l.kind == EventKind::Alloc && l.addr == addr)
    };
    let mut reused: Vec<u64> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if reused.len() == addresses {
            break;
        }
        if e.kind == EventKind::Alloc && !reused.contains(&e.addr) && allocated_later(i, e.addr) {
            reused.push(e.addr);
        }
    }
    let lost: Vec<bool> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            matches!(e.kind, EventKind::FreeRequested | EventKind::FreeCompleted)
                && reused.contains(&e.addr)
                && allocated_later(i, e.addr)
        })
        .collect();
    let mut at = 0;
    snapshot.events.retain(|_| {
        at += 1;
        !lost[at - 1]
    });
    lost.iter().filter(|&&l| l).count()
}

/// Replaces times, threads and call sites with fixed values.
fn normalize(snapshot: &mut Snapshot) {
    snapshot.epoch_unix_ns = EPOCH_UNIX_NS;
    snapshot.device.name = "sim (fixture)".to_string();
    for (i, e) in snapshot.events.iter_mut().enumerate() {
        e.time_ns = i as u64 * NS_PER_EVENT;
        e.thread = 0;
    }
    let first_seq = snapshot.events.first().map_or(0, |e| e.seq);
    for m in &mut snapshot.steps {
        m.time_ns = (m.seq - first_seq) * NS_PER_EVENT;
    }
    for s in &mut snapshot.segments {
        for b in &mut s.blocks {
            b.thread = 0;
        }
    }
    let fixed = fixed_sites();
    for (i, site) in snapshot.sites.iter_mut().enumerate() {
        *site = fixed.get(i).cloned().unwrap_or_else(|| CallSite {
            file: "extra.py".to_string(),
            line: 100 + i as u32,
            column: 0,
            function: "helper".to_string(),
            frames: Vec::new(),
        });
    }
}

/// A state with `blocks` live blocks of mixed sizes from a few dozen call sites, for the
/// drawing benchmark (times and sites fixed as in [`training_snapshot`]).
pub fn many_blocks_snapshot(blocks: usize) -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 40), AllocatorConfig::default());
    let mut live = Vec::with_capacity(blocks);
    let mut i = 0usize;
    while live.len() < blocks {
        i += 1;
        if i.is_multiple_of(1000) {
            alloc.mark_step();
        }
        let size = 512 * (1 + (i as u64 * 7919) % 4096);
        match alloc.alloc_ptr(size, vramscope_allocator::StreamId::DEFAULT) {
            Ok(p) => live.push(p),
            Err(_) => break,
        }
        if i % 5 == 4 {
            if let Some(p) = live.pop() {
                let _ = alloc.free_ptr(p);
            }
        }
    }
    let mut snapshot = alloc.snapshot();
    normalize(&mut snapshot);
    // Spread the blocks over several fake call sites.
    let sites = snapshot.sites.len().max(1) as u32;
    let extra = 40u32;
    for (i, e) in snapshot.events.iter_mut().enumerate() {
        if e.site.is_some() {
            e.site = Id::new(i as u32 % (sites + extra));
        }
    }
    // Each live block keeps the site of the allocation that made it, as a real snapshot's
    // does (a block named otherwise would be a trace that contradicts itself).
    let mut site_at: std::collections::HashMap<u64, Option<u32>> = Default::default();
    for e in snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
    {
        site_at.insert(e.addr, e.site());
    }
    for s in &mut snapshot.segments {
        for b in s.blocks.iter_mut().filter(|b| b.site.is_some()) {
            if let Some(&site) = site_at.get(&b.address) {
                b.site = site;
            }
        }
    }
    for i in 0..extra {
        snapshot.sites.push(CallSite {
            file: format!("layers/block_{i}.py"),
            line: 10 + i,
            column: 0,
            function: "forward".to_string(),
            frames: vec![
                frame(&format!("layers/block_{i}.py"), 10 + i, "forward"),
                frame("torch/nn/modules/module.py", 1501, "_call_impl"),
                frame("train.py", 74, "train_step"),
            ],
        });
    }
    snapshot
}
