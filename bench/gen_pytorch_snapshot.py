#!/usr/bin/env python3
"""Writes a big PyTorch memory snapshot pickle made from a real one, for benchmarks (issue 18).

The trace entries of a shared trace are repeated until there are EVENTS of them, each copy
shifted in time, with a fresh frames list per entry that shares the frame dicts (as
`torch.cuda.memory._dump_snapshot()` writes them); the segments and settings are the
original's. The output is a file for benchmarks only: never commit it (it is derived from the
shared traces).

    python3 bench/gen_pytorch_snapshot.py ../shared/traces/decomfl_opt125m_zo_fedlearn.pickle \
        1000000 /tmp/decomfl_1m.pickle
"""

import pickle
import sys


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    source, events, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(source, "rb") as f:
        snapshot = pickle.load(f)
    trace = snapshot["device_traces"][0]
    times = [e.get("time_us", 0) for e in trace]
    span = (max(times) - min(times) + 1) if times else 1
    out = []
    copy = 0
    while len(out) < events:
        for entry in trace:
            if len(out) == events:
                break
            e = dict(entry)
            if "time_us" in e:
                e["time_us"] = e["time_us"] + copy * span
            e["frames"] = list(e.get("frames", []))
            out.append(e)
        copy += 1
    snapshot["device_traces"] = [out] + snapshot["device_traces"][1:]
    with open(output, "wb") as f:
        pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    main()
