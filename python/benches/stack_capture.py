"""Per-allocation cost of vramscope's Python stack capture, on SimAllocator.

    python python/benches/stack_capture.py [--n 200000]

At Python stack depths 10 and 50 it times ``alloc`` + ``free`` pairs with the capture on and
off (the difference is the capture: walking the frames, looking the chain up in the cache)
and ``_native.current_site()`` alone (a walk and a lookup, no allocation, and the stack
copied into Python lists). A steady loop, so every stack after the first is a cache hit, as
in a training loop. On CPython 3.11+ the cache is keyed by instruction offset;
``VRAMSCOPE_PY_STACK_BY_LINE=1`` keys it by line, as before, for comparison.

Then the pluggable allocator on a thread without Python (as autograd's backward thread),
on the simulated device: ``vramscope_malloc`` + ``vramscope_free`` pairs with no native stack
and with one for every allocation (``set_native_stacks(1)``; the default samples one in 16).
The stack there is shallow (the depth is printed); autograd's is some 40 to 60 frames.
"""

import argparse
import platform
import sys
import time

import vramscope
from vramscope import _native


def at_depth(depth, fn):
    """Runs ``fn`` with ``depth`` Python frames on the stack (this module's frames included)."""
    base = len(_stack())
    def down(n):
        return down(n - 1) if n > 0 else fn()
    return down(depth - base - 1)


def _stack():
    frames, f = [], sys._getframe()
    while f is not None:
        frames.append(f)
        f = f.f_back
    return frames


def time_pairs(alloc, n):
    def loop():
        a = alloc.alloc
        start = time.perf_counter_ns()
        for _ in range(n):
            a(4096).free()
        return (time.perf_counter_ns() - start) / n
    return loop


def time_walk(n):
    def loop():
        site = _native.current_site
        start = time.perf_counter_ns()
        for _ in range(n):
            site()
        return (time.perf_counter_ns() - start) / n
    return loop


def best(fn, repeats=5):
    return min(fn() for _ in range(repeats))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    args = parser.parse_args()
    _native.set_stack_depth(128)
    print(f"python {platform.python_version()} on {platform.machine()}, {platform.processor() or 'cpu'}; "
          f"n={args.n}, best of 5; stacks keyed by "
          f"{'instruction offset' if _native.stack_keyed_by_offset() else 'line'}")
    print(f"{'depth':>5}  {'pair, capture off':>18}  {'pair, capture on':>17}  {'capture':>8}  "
          f"{'current_site()':>14}")
    for depth in (10, 50):
        on = vramscope.SimAllocator("1 GiB")
        off = vramscope.SimAllocator("1 GiB", capture_stacks=False)
        t_off = at_depth(depth, lambda: best(time_pairs(off, args.n)))
        t_on = at_depth(depth, lambda: best(time_pairs(on, args.n)))
        t_walk = at_depth(depth, lambda: best(time_walk(args.n)))
        frames = at_depth(depth, lambda: len(_native.current_site()[3]))
        assert frames == depth, (frames, depth)
        print(f"{depth:>5}  {t_off:>15.0f} ns  {t_on:>14.0f} ns  {t_on - t_off:>5.0f} ns  "
              f"{t_walk:>11.0f} ns")
    native_thread(args.n)


def native_thread(n):
    import os

    if os.environ.get("VRAMSCOPE_BACKEND", "").lower() != "sim":
        print("native thread: skipped (run with VRAMSCOPE_BACKEND=sim)")
        return
    every = _native.native_stacks()[0]
    times = {}
    for sample in (0, 1):
        _native.set_native_stacks(sample)
        times[sample], frames = min(_native.time_native_thread_pairs(0, 4096, n)
                                    for _ in range(5))
    _native.set_native_stacks(every)
    print(f"native thread ({frames} frames): pair without stack {times[0]:.0f} ns, with a "
          f"native stack {times[1]:.0f} ns, capture {times[1] - times[0]:.0f} ns")


if __name__ == "__main__":
    main()
