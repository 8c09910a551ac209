"""Cost of `attach(listen=...)`'s history feed on real PyTorch snapshots.

    python python/benches/live_history.py [PICKLE...]

(by default the pickles of ``$VRAMSCOPE_TRACES``, else of ``../shared/traces``).

For each snapshot pickle (what ``torch.cuda.memory._snapshot()`` returns, as written by
``_dump_snapshot``): ``pickle.loads`` (building the dict, an indication of what
``_snapshot()`` itself costs, which needs torch and is not timed here), the Python side's
``pickle.dumps`` of the dict (what the feeder does with ``_snapshot()``'s result), then ``LivePublisher.history`` on those bytes twice: the
first call publishes every entry, the second finds nothing new (the steady cost of a call
when the program allocated little since the last one). Best of 5. The feeder spaces its calls
so that they take at most 2% of the wall time: the interval is the larger of 1 s and 50 times
the cost of a call.
"""

import glob
import os
import pickle
import platform
import sys
import tempfile
import time

from vramscope import _native


def best(fn, repeats=5):
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return min(out)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    traces = os.environ.get("VRAMSCOPE_TRACES") or os.path.join(here, "..", "..", "..",
                                                                 "shared", "traces")
    paths = sys.argv[1:] or sorted(glob.glob(os.path.join(traces, "*.pickle")))
    if not paths:
        print(f"no snapshot pickles given and none in {traces}")
        return
    print(f"python {platform.python_version()} on {platform.machine()}; best of 5")
    print(f"{'snapshot':<40} {'entries':>8} {'pickle.loads':>13} {'pickle.dumps':>13} "
          f"{'history, all new':>17} {'history, none new':>18} {'interval':>9}")
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        doc = pickle.loads(data)
        entries = sum(len(t) for t in doc.get("device_traces", []))
        loads = best(lambda: pickle.loads(data))
        dumps = best(lambda: pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL))
        raw = pickle.dumps(doc, protocol=pickle.HIGHEST_PROTOCOL)
        with tempfile.TemporaryDirectory() as tmp:
            def fresh():
                publisher = _native.LivePublisher(f"unix:{tmp}/bench.sock")
                publisher.history(raw)
                publisher.close()

            first = best(fresh)
            publisher = _native.LivePublisher(f"unix:{tmp}/bench.sock")
            publisher.history(raw)
            again = best(lambda: publisher.history(raw))
            publisher.close()
        interval = max(1.0, 50 * (dumps + again))
        print(f"{os.path.basename(path):<40} {entries:>8} {loads * 1e3:>10.1f} ms "
              f"{dumps * 1e3:>10.1f} ms "
              f"{first * 1e3:>14.1f} ms {again * 1e3:>15.1f} ms {interval:>7.1f} s")


if __name__ == "__main__":
    main()
