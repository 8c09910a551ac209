#!/usr/bin/env python3
"""Writes a PyTorch memory snapshot pickle with many segments, as a run with expandable
segments off and many large allocations records it, for the HTML page's size (issue 36; the
figures are in BENCHMARKS.md): SEGMENTS cudaMalloc'd segments, every third of 20 MiB (large
pool) and the others of 2 MiB (small pool), each holding one to four blocks from 40 sites;
then, in six rounds, about a third of the blocks are freed, a fifth of the empty segments get
a block again and half of the others are released, so that the explorer's moments see
different segment maps. The output is deterministic (a seeded generator).

    python3 testkit/data/gen_many_segments.py 51200 /tmp/many_segments.pickle
    target/release/vramscope report /tmp/many_segments.pickle --format html | wc -c

51,200 segments make 374,354 events and a 26 MB file: never commit it.
"""
import pickle
import random
import sys

MIB = 1 << 20


def main():
    segments, out = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(36)
    frames = [[{"name": f"layer{i}", "filename": f"model/block{i % 7}.py", "line": 10 + i}]
              for i in range(40)]
    trace = []
    t = [1_700_000_000_000_000]

    def ev(action, addr, size):
        t[0] += 1
        trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                      "time_us": t[0], "frames": frames[addr // MIB % len(frames)]})

    base = 0x7F00_0000_0000
    segs = []  # (addr, size, blocks: list of (addr, size))
    addr = base
    for i in range(segments):
        size = 2 * MIB if i % 3 else 20 * MIB
        ev("segment_alloc", addr, size)
        blocks = []
        off = 0
        for _ in range(rng.randint(1, 4)):
            bsize = rng.choice([512, 4096, 65536, 262144]) if size == 2 * MIB else rng.choice([MIB, 2 * MIB, 4 * MIB])
            if off + bsize > size:
                break
            ev("alloc", addr + off, bsize)
            blocks.append((addr + off, bsize))
            off += bsize
        segs.append([addr, size, blocks])
        addr += size
    for rnd in range(6):
        # Free about a third of the blocks, allocate again in some of the freed places.
        for s in segs:
            if s[2] and rng.random() < 0.33:
                a, b = s[2].pop()
                ev("free_requested", a, b)
                ev("free_completed", a, b)
        for s in segs:
            if rng.random() < 0.2 and not s[2]:
                ev("alloc", s[0], 512)
                s[2].append((s[0], 512))
        # Release a few idle segments (as empty_cache would).
        keep = []
        for s in segs:
            if not s[2] and rng.random() < 0.5:
                ev("segment_free", s[0], s[1])
            else:
                keep.append(s)
        segs = keep
    snapshot_segments = []
    for a, size, blocks in segs:
        bl = []
        off = a
        for ba, bs in sorted(blocks):
            if ba > off:
                bl.append({"address": off, "size": ba - off, "requested_size": 0, "state": "inactive", "frames": []})
            bl.append({"address": ba, "size": bs, "requested_size": bs, "state": "active_allocated",
                       "frames": frames[ba // MIB % len(frames)]})
            off = ba + bs
        if off < a + size:
            bl.append({"address": off, "size": a + size - off, "requested_size": 0, "state": "inactive", "frames": []})
        snapshot_segments.append({"device": 0, "address": a, "total_size": size,
                                  "allocated_size": sum(b for _, b in blocks), "active_size": sum(b for _, b in blocks),
                                  "requested_size": sum(b for _, b in blocks), "stream": 0,
                                  "segment_type": "small" if size == 2 * MIB else "large",
                                  "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": bl})
    snap = {"segments": snapshot_segments, "device_traces": [trace],
            "allocator_settings": {"expandable_segments": False}, "external_annotations": []}
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    print(f"{len(trace)} events, {segments} segments allocated, {len(segs)} at the end")


main()
