//! Allocation traces as flat operation lists that every allocator under test replays alike.
//!
//! A trace's addresses are turned into dense slot numbers once, while it is built: slot `i` is
//! the `i`-th allocation, and a free names the slot of the allocation it ends. Each replay then
//! keeps its own handle per slot (the map from trace address to the allocator's own handle is a
//! vector indexed by slot), so no allocator pays for a hash lookup the others do not.
//!
//! Two sources: the alloc/free sequence of a real trace ([`Trace::from_snapshot`], through the
//! inspector's importers), and a synthetic training loop ([`Trace::synthetic`]).

use std::collections::HashMap;

use vramscope_model::{EventKind, Snapshot};

/// One operation of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes for use on `stream`; the allocation is slot `slot`.
    Alloc {
        /// Slot number of this allocation.
        slot: u32,
        /// Bytes requested (at least 1).
        size: u64,
        /// Stream the trace allocated on.
        stream: u64,
    },
    /// Free the allocation in slot `slot`.
    Free {
        /// Slot number of the allocation being freed.
        slot: u32,
    },
}

/// An alloc/free sequence with the figures every replay is compared against.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Short name for tables.
    pub name: String,
    /// The operations, in trace order.
    pub ops: Vec<Op>,
    /// Number of slots (allocations).
    pub slots: usize,
    /// Allocations in the sequence.
    pub allocs: usize,
    /// Frees in the sequence.
    pub frees: usize,
    /// Frees in the source trace of blocks allocated before it began (left out of `ops`).
    pub unmatched_frees: usize,
    /// Highest sum of live requested bytes over the sequence: the "peak allocated" that every
    /// allocator's peak reserved bytes are divided by.
    pub peak_live: u64,
    /// Largest single request.
    pub max_size: u64,
    /// Most allocations live at once.
    pub max_live_blocks: usize,
}

impl Trace {
    /// Builds a trace from operations whose slots are already dense, computing the figures.
    fn from_ops(name: &str, ops: Vec<Op>, slots: usize, unmatched_frees: usize) -> Trace {
        let mut sizes = vec![0u64; slots];
        let (mut live, mut peak_live, mut max_size) = (0u64, 0u64, 0u64);
        let (mut live_blocks, mut max_live_blocks) = (0usize, 0usize);
        let (mut allocs, mut frees) = (0, 0);
        for op in &ops {
            match *op {
                Op::Alloc { slot, size, .. } => {
                    sizes[slot as usize] = size;
                    live += size;
                    live_blocks += 1;
                    allocs += 1;
                    peak_live = peak_live.max(live);
                    max_live_blocks = max_live_blocks.max(live_blocks);
                    max_size = max_size.max(size);
                }
                Op::Free { slot } => {
                    live -= sizes[slot as usize];
                    live_blocks -= 1;
                    frees += 1;
                }
            }
        }
        Trace {
            name: name.to_string(),
            ops,
            slots,
            allocs,
            frees,
            unmatched_frees,
            peak_live,
            max_size,
            max_live_blocks,
        }
    }

    /// The alloc/free sequence of `snapshot`'s own device: `Alloc` events (requested bytes where
    /// the trace has them, else block size) and `FreeCompleted` events. Frees of blocks
    /// allocated before the trace began are counted and left out.
    pub fn from_snapshot(name: &str, snapshot: &Snapshot) -> Trace {
        let device = snapshot.device.index;
        let mut live: HashMap<u64, u32> = HashMap::new();
        let mut ops = Vec::new();
        let mut slots = 0u32;
        let mut unmatched = 0;
        for event in snapshot
            .events
            .iter()
            .filter(|e| u32::from(e.device) == device)
        {
            match event.kind {
                EventKind::Alloc => {
                    let size = if event.requested > 0 {
                        event.requested
                    } else {
                        event.size
                    };
                    // A second allocation at a live address means the trace lost a free; the
                    // older block then stays live to the end, as it did for the program.
                    live.insert(event.addr, slots);
                    ops.push(Op::Alloc {
                        slot: slots,
                        size: size.max(1),
                        stream: event.stream,
                    });
                    slots += 1;
                }
                EventKind::FreeCompleted => match live.remove(&event.addr) {
                    Some(slot) => ops.push(Op::Free { slot }),
                    None => unmatched += 1,
                },
                _ => {}
            }
        }
        Trace::from_ops(name, ops, slots as usize, unmatched)
    }

    /// A training loop of a small decoder-only transformer with AdamW, `steps` steps long:
    /// weights allocated once, activations saved layer by layer in the forward pass and freed
    /// last-in first-out in the backward pass, per-layer temporaries, gradients allocated in
    /// the backward pass and freed by `zero_grad(set_to_none=True)`, optimizer state allocated
    /// in the first step, `foreach`-style optimizer temporaries, and a sprinkle of small index
    /// and mask tensors. The sequence length varies per step (dynamic shapes), so activation
    /// sizes change from step to step. Sizes run from 512 B to about 400 MiB. Deterministic for
    /// a given `seed`.
    pub fn synthetic(steps: usize, seed: u64) -> Trace {
        let mut gen = Synth {
            rng: SplitMix64(seed),
            ops: Vec::new(),
            slots: 0,
        };
        const LAYERS: usize = 12;
        const D: u64 = 1024;
        const HEADS: u64 = 16;
        const VOCAB: u64 = 50_304;
        const BATCH: u64 = 4;
        const F32: u64 = 4;
        const BF16: u64 = 2;

        // Parameters: the embedding, then per layer two layer norms (weight and bias), the
        // attention projections and the feed-forward matrices with their biases.
        let mut param_sizes = vec![VOCAB * D * F32];
        for _ in 0..LAYERS {
            param_sizes.extend_from_slice(&[
                D * F32,
                D * F32,
                D * 3 * D * F32,
                3 * D * F32,
                D * D * F32,
                D * F32,
                D * F32,
                D * F32,
                D * 4 * D * F32,
                4 * D * F32,
                4 * D * D * F32,
                D * F32,
            ]);
        }
        param_sizes.extend_from_slice(&[D * F32, D * F32]);
        let weights: Vec<u32> = param_sizes.iter().map(|&s| gen.alloc(s)).collect();
        let mut optimizer_state: Vec<u32> = Vec::new();

        for step in 0..steps {
            // Dynamic shapes: the sequence length of this step's batch.
            let seq = [384u64, 448, 512, 320][gen.rng.below(4) as usize];
            let tokens = BATCH * seq;
            let input = gen.alloc(tokens * 8);
            let mut saved: Vec<Vec<u32>> = Vec::with_capacity(LAYERS);
            let embedded = gen.alloc(tokens * D * BF16);
            for _ in 0..LAYERS {
                let mut layer = Vec::new();
                layer.push(gen.alloc(tokens * D * BF16)); // layer norm 1 output
                layer.push(gen.alloc(tokens * 2 * F32)); // its mean and rstd
                layer.push(gen.alloc(tokens * 3 * D * BF16)); // q, k, v
                let scores = gen.alloc(BATCH * HEADS * seq * seq * BF16);
                let softmax_tmp = gen.alloc(BATCH * HEADS * seq * seq * F32);
                gen.free(softmax_tmp);
                layer.push(scores);
                let dropout_mask = gen.alloc(BATCH * HEADS * seq * seq);
                layer.push(dropout_mask);
                layer.push(gen.alloc(tokens * D * BF16)); // attention output
                layer.push(gen.alloc(tokens * D * BF16)); // residual
                layer.push(gen.alloc(tokens * D * BF16)); // layer norm 2 output
                layer.push(gen.alloc(tokens * 2 * F32));
                layer.push(gen.alloc(tokens * 4 * D * BF16)); // feed-forward 1
                layer.push(gen.alloc(tokens * 4 * D * BF16)); // GELU
                let workspace = gen.alloc(tokens * 4 * D * BF16);
                gen.free(workspace);
                layer.push(gen.alloc(tokens * D * BF16)); // residual
                gen.sprinkle(2);
                saved.push(layer);
            }
            let logits = gen.alloc(tokens * VOCAB * BF16);
            let loss = gen.alloc(512);
            gen.sprinkle(3);

            // Backward: the logits' gradient first, then the layers in reverse, each freeing
            // its saved activations last-in first-out.
            let mut grads: Vec<Option<u32>> = vec![None; weights.len()];
            let grad_logits = gen.alloc(tokens * VOCAB * BF16);
            gen.free(logits);
            let mut grad_hidden = gen.alloc(tokens * D * BF16);
            gen.free(grad_logits);
            let mut param = weights.len() - 2;
            grads[param] = Some(gen.alloc(param_sizes[param]));
            grads[param + 1] = Some(gen.alloc(param_sizes[param + 1]));
            for layer in saved.into_iter().rev() {
                let grad_ff = gen.alloc(tokens * 4 * D * BF16);
                let grad_gelu = gen.alloc(tokens * 4 * D * BF16);
                gen.free(grad_ff);
                let grad_attn = gen.alloc(tokens * 3 * D * BF16);
                let grad_scores = gen.alloc(BATCH * HEADS * seq * seq * F32);
                gen.free(grad_scores);
                param -= 12;
                for p in param..param + 12 {
                    grads[p] = Some(gen.alloc(param_sizes[p]));
                }
                gen.free(grad_attn);
                gen.free(grad_gelu);
                for block in layer.into_iter().rev() {
                    gen.free(block);
                }
                let next = gen.alloc(tokens * D * BF16);
                gen.free(grad_hidden);
                grad_hidden = next;
                gen.sprinkle(1);
            }
            grads[0] = Some(gen.alloc(param_sizes[0]));
            gen.free(grad_hidden);
            gen.free(embedded);
            gen.free(input);
            gen.free(loss);

            // Optimizer: state on the first step, then foreach temporaries for every
            // parameter at once (the denominators, then the updates).
            if step == 0 {
                for &size in &param_sizes {
                    optimizer_state.push(gen.alloc(size)); // exp_avg
                    optimizer_state.push(gen.alloc(size)); // exp_avg_sq
                    optimizer_state.push(gen.alloc(512)); // step
                }
            }
            let denominators: Vec<u32> = param_sizes.iter().map(|&s| gen.alloc(s)).collect();
            for d in denominators.into_iter().rev() {
                gen.free(d);
            }
            let updates: Vec<u32> = param_sizes.iter().map(|&s| gen.alloc(s)).collect();
            for u in updates {
                gen.free(u);
            }
            // zero_grad(set_to_none=True).
            for g in grads.into_iter().flatten() {
                gen.free(g);
            }
            gen.sprinkle(4);
        }
        let _ = (weights, optimizer_state);
        let slots = gen.slots as usize;
        Trace::from_ops("synthetic", gen.ops, slots, 0)
    }
}

/// Builds a synthetic trace.
struct Synth {
    rng: SplitMix64,
    ops: Vec<Op>,
    slots: u32,
}

impl Synth {
    fn alloc(&mut self, size: u64) -> u32 {
        let slot = self.slots;
        self.slots += 1;
        self.ops.push(Op::Alloc {
            slot,
            size: size.max(1),
            stream: 0,
        });
        slot
    }

    fn free(&mut self, slot: u32) {
        self.ops.push(Op::Free { slot });
    }

    /// Puts `items` in a random order (Fisher-Yates).
    fn shuffle(&mut self, items: &mut [u32]) {
        for i in (1..items.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// Up to `n` small index or mask tensors (512 B to 64 KiB), each freed at once or after
    /// the next one, so that small blocks interleave with the large ones.
    fn sprinkle(&mut self, n: u64) {
        let count = self.rng.below(n + 1);
        let mut held = None;
        for _ in 0..count {
            let size = 512 << self.rng.below(8);
            let slot = self.alloc(size);
            if let Some(previous) = held.replace(slot) {
                self.free(previous);
            }
        }
        if let Some(last) = held {
            self.free(last);
        }
    }
}

impl Trace {
    /// An adversarial case for free lists: `blocks` equal-size blocks (64 KiB, the small
    /// pool) are allocated back to back, every other one is freed in random order, so that
    /// `blocks / 2` free blocks of one size that cannot merge pile up in one size class, and
    /// then they are allocated again and everything is freed in random order; `rounds` times.
    /// Equal-size tensors interleaved with longer-lived ones (per-layer buffers, cache
    /// blocks) freed out of order make this pattern. Deterministic for a given `seed`.
    pub fn scattered(blocks: usize, rounds: usize, seed: u64) -> Trace {
        const SIZE: u64 = 64 * 1024;
        let mut gen = Synth {
            rng: SplitMix64(seed),
            ops: Vec::new(),
            slots: 0,
        };
        for _ in 0..rounds {
            let mut live: Vec<u32> = (0..blocks).map(|_| gen.alloc(SIZE)).collect();
            let mut odd: Vec<u32> = live.iter().skip(1).step_by(2).copied().collect();
            live = live.iter().step_by(2).copied().collect();
            gen.shuffle(&mut odd);
            for &slot in &odd {
                gen.free(slot);
            }
            live.extend(odd.iter().map(|_| gen.alloc(SIZE)));
            gen.shuffle(&mut live);
            for &slot in &live {
                gen.free(slot);
            }
        }
        let slots = gen.slots as usize;
        Trace::from_ops("scattered", gen.ops, slots, 0)
    }
}

/// SplitMix64: a small deterministic generator, enough for reproducible traces.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scattered_trace_piles_up_half_its_blocks_free() {
        let a = Trace::scattered(1_000, 2, 7);
        assert_eq!(a.ops, Trace::scattered(1_000, 2, 7).ops);
        assert_eq!(a.allocs, 3_000);
        assert_eq!(a.frees, 3_000);
        assert_eq!(a.max_live_blocks, 1_000);
        // After the first 1,000 allocations come 500 frees, of every other block.
        let freed: Vec<u32> = a.ops[1_000..1_500]
            .iter()
            .map(|op| match op {
                Op::Free { slot } => *slot,
                Op::Alloc { .. } => panic!("a free was expected"),
            })
            .collect();
        assert!(freed.iter().all(|slot| slot % 2 == 1));
        assert!(
            freed.windows(2).any(|w| w[0] > w[1]),
            "frees are out of order"
        );
    }

    #[test]
    fn synthetic_trace_is_deterministic_and_balanced() {
        let a = Trace::synthetic(3, 7);
        let b = Trace::synthetic(3, 7);
        assert_eq!(a.ops, b.ops);
        // Weights and optimizer state stay live; everything else is freed.
        assert!(a.allocs > a.frees);
        assert!(a.max_size > 100 << 20);
        let min = a
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc { size, .. } => Some(*size),
                Op::Free { .. } => None,
            })
            .min()
            .unwrap();
        assert_eq!(min, 512);
    }
}
