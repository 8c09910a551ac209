#!/usr/bin/env python3
"""Writes a big PyTorch memory snapshot pickle made from a real one, for benchmarks (issue 18).

The trace entries of a shared trace are repeated, each copy shifted in time, with a fresh
frames list per entry that shares the frame dicts (as `torch.cuda.memory._dump_snapshot()`
writes them). Between two copies, a teardown frees every block the copy left allocated and
releases every segment it left reserved (as a process that frees its tensors and calls
`empty_cache()` would), so that the next copy allocates into an empty cache at the same
addresses. The output keeps the last EVENTS entries: a trace that starts in the middle of a
run, as PyTorch's recording ring keeps it, whose last copy ends where the source trace ended,
so the source's segments are the dump-time state. The result is a consistent trace: every
allocation is at an address no live block holds. (Files made before this teardown repeated
the entries as they were, so each copy allocated over the blocks the one before it left live;
`vramscope report` names such allocations as frees the trace lost.)

A source trace that frees blocks from before it is repeated faithfully only in its first copy;
the shared decomfl trace allocates everything it frees.

The output is a file for benchmarks only: never commit it (it is derived from the shared
traces).

    python3 bench/gen_pytorch_snapshot.py ../shared/traces/decomfl_opt125m_zo_fedlearn.pickle \\
        1000000 /tmp/decomfl_1m.pickle
"""

import pickle
import sys


def teardown(trace, end_us):
    """The entries that free what `trace` leaves allocated and release what it leaves
    reserved, from `end_us` on, one microsecond apart."""
    live = {}
    segments = {}
    for e in trace:
        action, addr = e["action"], e.get("addr")
        if action == "alloc":
            live[addr] = e
        elif action == "free_completed":
            live.pop(addr, None)
        elif action == "segment_alloc":
            segments[addr] = e
        elif action == "segment_free":
            segments.pop(addr, None)
    out = []
    t = end_us
    for kind, entries in (("block", live), ("segment", segments)):
        for alloc in entries.values():
            actions = ("free_requested", "free_completed") if kind == "block" else ("segment_free",)
            for action in actions:
                t += 1
                e = dict(alloc)
                e["action"] = action
                e["time_us"] = t
                e["frames"] = list(alloc.get("frames", []))
                out.append(e)
    return out


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    source, events, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(source, "rb") as f:
        snapshot = pickle.load(f)
    trace = snapshot["device_traces"][0]
    times = [e["time_us"] for e in trace if "time_us" in e]
    start = min(times) if times else 0
    end = max(times) if times else 0
    closing = teardown(trace, end)
    # One copy and its teardown span this long; the next copy starts after it.
    span = (end - start + 1) + len(closing) + 1
    per_copy = len(trace) + len(closing)
    copies = max(1, -(-events // per_copy) + 1)
    out = []
    for copy in range(copies):
        shift = (copy - copies + 1) * span
        for entry in trace:
            e = dict(entry)
            if "time_us" in e:
                e["time_us"] = e["time_us"] + shift
            e["frames"] = list(e.get("frames", []))
            out.append(e)
        if copy + 1 < copies:
            for entry in closing:
                e = dict(entry)
                e["time_us"] = e["time_us"] + shift
                e["frames"] = list(e.get("frames", []))
                out.append(e)
    out = out[-events:] if events > 0 else []
    snapshot["device_traces"] = [out] + snapshot["device_traces"][1:]
    with open(output, "wb") as f:
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    main()
