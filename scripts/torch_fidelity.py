"""vramscope's fidelity check against PyTorch's own CUDA caching allocator, on a GPU.

For each case (allocator settings, and optionally a cap on what the allocator may reserve), a
fresh Python process runs a small, deterministic transformer training loop with varied batch
shapes, so the pools split, merge and fragment, with PyTorch's memory history on. It writes the
snapshot and PyTorch's own counters (max_memory_reserved, max_memory_allocated, device
allocations and frees, alloc retries, OOMs). Then `vramscope replay --verify` replays the snapshot
with the same settings and cap: the two sets of numbers must be equal, and the replay's device
calls (segment allocations, frees, maps, unmaps) must be the trace's, one for one, in order.

  python3 scripts/torch_fidelity.py check --vramscope BIN --out DIR   every case; exit 1 on a difference
  python3 scripts/torch_fidelity.py record DIR NAME [--limit-bytes N] [--side-stream]
                                                                      one recording (used by check)

A cap is applied with torch.cuda.set_per_process_memory_fraction, which makes PyTorch free its
cache and retry (or run out of memory) where an uncapped run would reserve more; the replay is
given the same cap as --capacity. scripts/gpu-check.sh runs `check`.
"""

import json
import os
import subprocess
import sys

# (name, PYTORCH_CUDA_ALLOC_CONF, capped from, side stream): a capped case is capped a third of
# the way from the named earlier (uncapped) case's peak allocated to its peak reserved; a case
# with a side stream allocates some tensors on a second stream and frees them after use on the
# first (record_stream), so their frees wait for the first stream.
CASES = [
    ("default", "", None, False),
    ("default_capped", "", "default", False),
    ("expandable", "expandable_segments:True", None, False),
    ("expandable_capped", "expandable_segments:True", "expandable", False),
    ("split64_gc", "max_split_size_mb:64,garbage_collection_threshold:0.6", "default", False),
    ("split64", "max_split_size_mb:64", None, False),
    ("gc80_capped", "garbage_collection_threshold:0.8", "default", False),
    ("roundup4", "roundup_power2_divisions:4", None, False),
    ("streams", "", None, True),
]

COMPARED = [
    ("peak reserved", "max_memory_reserved", "peak_reserved"),
    ("peak allocated", "max_memory_allocated", "peak_allocated"),
    ("device allocations", "num_device_alloc", "segment_allocs"),
    ("device frees", "num_device_free", "segment_frees"),
    ("alloc retries", "num_alloc_retries", "num_alloc_retries"),
    ("OOMs", "num_ooms", "num_ooms"),
]


def workload(torch, steps: int, side_stream: bool) -> int:
    """A training loop whose allocation sequence depends only on the seed and the shapes.

    Returns how many out-of-memory errors it caught (it stops at the first)."""
    torch.manual_seed(0)
    vocab, width = 8192, 512
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, width),
        *[torch.nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True, dropout=0.0) for _ in range(4)],
        torch.nn.Linear(width, vocab),
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    kept = []
    side = torch.cuda.Stream() if side_stream else None
    for step in range(steps):
        batch = 4 + 3 * (step % 5)
        length = 64 * (1 + (step * 7) % 6)
        tokens = torch.randint(0, vocab, (batch, length), device="cuda")
        try:
            logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), tokens.view(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            # Small, odd-sized tensors that outlive the step make holes in the small pool.
            if step % 3 == 0:
                kept.append(torch.empty(1000 + 37 * step, dtype=torch.uint8, device="cuda"))
            # A large buffer that lives through part of the run.
            if step == 4:
                kept.append(torch.empty(300 << 20, dtype=torch.uint8, device="cuda"))
            if step == 9:
                kept = [t for t in kept if t.numel() < (1 << 20)]
            del logits, loss
            if side is not None and step % 2 == 1:
                # Made on the side stream, used and freed on the main one.
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    noise = torch.randn(batch * length, width, device="cuda")
                    scaled = noise * 2.0
                torch.cuda.current_stream().wait_stream(side)
                scaled.record_stream(torch.cuda.current_stream())
                total = scaled.sum()
                del noise, scaled, total
        except torch.OutOfMemoryError:
            return 1
        finally:
            del tokens
    return 0


def record(out_dir: str, name: str, limit: int | None, side_stream: bool) -> int:
    """One recording, in this process: the settings come from PYTORCH_CUDA_ALLOC_CONF."""
    import torch

    if not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        return 2
    total = torch.cuda.get_device_properties(0).total_memory
    cap = None
    if limit is not None:
        fraction = limit / total
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
        # PyTorch keeps the cap as size_t(fraction * total), computed in double precision.
        cap = int(fraction * total)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    ooms_caught = workload(torch, steps=15, side_stream=side_stream)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(os.path.join(out_dir, name + ".pickle"))
    stats = torch.cuda.memory_stats(0)
    result = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "cap": cap,
        "ooms_caught": ooms_caught,
        "max_memory_reserved": torch.cuda.max_memory_reserved(0),
        "max_memory_allocated": torch.cuda.max_memory_allocated(0),
    }
    for key in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"):
        result[key] = stats.get(key)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


def replay(vramscope: str, pickle: str, conf: str, cap: int | None, policy: str | None = None) -> dict:
    command = [vramscope, "replay", "--format", "json", "--verify", "--conf", conf, pickle]
    if cap is not None:
        command += ["--capacity", str(cap)]
    if policy is not None:
        command += ["--policy", policy]
    # `--verify` exits with 1 when the device calls differ; the JSON says where, and the
    # comparison below reports it. Any other failure is an error.
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)
    return json.loads(done.stdout)


def check(vramscope: str, out_dir: str) -> int:
    os.makedirs(out_dir, exist_ok=True)
    differences = 0
    limits = {}
    for name, conf, capped_from, side_stream in CASES:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        command = [sys.executable, __file__, "record", out_dir, name]
        if capped_from is not None:
            command += ["--limit-bytes", str(limits[capped_from])]
        if side_stream:
            command.append("--side-stream")
        status = subprocess.run(command, env=env).returncode
        if status == 2:
            return 2
        if status != 0:
            print(f"{name}: the recording failed (exit status {status})")
            differences += 1
            continue
        with open(os.path.join(out_dir, name + ".json")) as f:
            theirs = json.load(f)
        allocated = theirs["max_memory_allocated"]
        limits[name] = allocated + (theirs["max_memory_reserved"] - allocated) // 3
        ours = replay(vramscope, os.path.join(out_dir, name + ".pickle"), conf, theirs["cap"])
        with open(os.path.join(out_dir, name + ".replay.json"), "w") as f:
            json.dump(ours, f, indent=1)
        print(f"\n{name}: PYTORCH_CUDA_ALLOC_CONF={conf!r}, cap {theirs['cap']}, "
              f"torch {theirs['torch']} on {theirs['device']}")
        print(f"  {'':20} {'pytorch':>14} {'vramscope':>14}")
        for label, their_key, our_key in COMPARED:
            same = theirs[their_key] is None or theirs[their_key] == ours[our_key]
            verdict = "same" if same else "DIFFERENT"
            differences += not same
            print(f"  {label:20} {str(theirs[their_key]):>14} {ours[our_key]:>14}  {verdict}")
        calls = ours.get("device_calls")
        if calls is not None:
            apart = calls["first_difference"]
            differences += apart is not None
            print(f"  device calls: {calls['matching']} of {calls['trace_calls']} alike in order"
                  + (f"; first difference: {apart}" if apart else ""))
        if name == "default":
            compact = replay(vramscope, os.path.join(out_dir, name + ".pickle"), conf, None, "compact")
            worse = compact["peak_reserved"] > ours["peak_reserved"]
            differences += worse
            print(f"  compact policy: peak reserved {compact['peak_reserved']} "
                  f"({compact['peak_reserved'] / compact['peak_allocated']:.3f}x peak allocated), "
                  f"{compact['segment_allocs']} device allocations"
                  f"{'  MORE THAN PYTORCH' if worse else ''}")
    print(f"\nfidelity: {len(CASES)} cases, {differences} difference(s)")
    return 1 if differences else 0


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "record":
        limit = None
        if "--limit-bytes" in sys.argv:
            limit = int(sys.argv[sys.argv.index("--limit-bytes") + 1])
        return record(sys.argv[2], sys.argv[3], limit, "--side-stream" in sys.argv)
    if len(sys.argv) == 6 and sys.argv[1] == "check" and sys.argv[2] == "--vramscope" and sys.argv[4] == "--out":
        return check(sys.argv[3], sys.argv[5])
    print(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main())
