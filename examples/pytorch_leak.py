"""The three classic PyTorch memory mistakes, watched by vramscope.

    python examples/pytorch_leak.py --mode attach          # PyTorch's allocator, recorded
    python examples/pytorch_leak.py --mode use_allocator   # vramscope's allocator under torch
    python examples/pytorch_leak.py --mode attach --check  # assert the findings name the lines
    python examples/pytorch_leak.py --mode attach --listen unix:/tmp/leak.sock  # and live

The bugs (each line is marked with its BUG comment):

1. the loss tensor appended to a list every step (it keeps its autograd graph alive),
2. ``.item()`` on every element of a tensor inside the loop (a device sync per element),
3. a tensor made on the CPU every step and copied to the GPU (the wrong device).

``--bugs off`` trains without them, and ``--time`` prints the mean step time (for the
overhead figures in BENCHMARKS.md: ``--mode plain`` is PyTorch without vramscope).
``--listen ADDR`` (the attach modes) publishes live telemetry for ``vramscope top ADDR`` and,
before the script ends, waits up to 30 seconds for a dashboard to attach and be sent the whole
run. Needs torch with CUDA; scripts/gpu-check.sh runs it both ways, and live.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import vramscope


def train(steps, bugs, batch=256, width=2048):
    device = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 16),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    total = 0.0
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 16, (batch,), device=device)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        if bugs:
            noise = torch.randn(batch, width).to(device)  # BUG-3 wrong device
            inputs = x + noise
        else:
            inputs = x + torch.randn(batch, width, device=device)
        out = model(inputs)  # LEAK-ALLOC forward
        loss = F.cross_entropy(out, y)  # LEAK-ALLOC loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()  # vramscope marks a step here (optimizer step hook)
        if bugs:
            losses.append(loss)  # BUG-1 keeps the graph of every step
            for value in out[:8, 0]:
                total += value.item()  # BUG-2 a sync per element
        else:
            losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return losses, times


def wait_for_dashboard(session, seconds=30.0):
    """Waits until a dashboard is attached to the session's live telemetry and has been sent
    the history up to now (the session sends it about once a second while one is attached),
    for at most ``seconds``; says whether one was."""
    feeder = session.feeder
    sent_before = feeder.history_calls
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if session.live.clients > 0 and feeder.history_calls > sent_before:
            return True
        time.sleep(0.05)
    print(f"no dashboard attached within {seconds:.0f} s", file=sys.stderr)
    return False


def lines(marker):
    with open(os.path.abspath(__file__)) as f:
        return [i + 1 for i, text in enumerate(f) if marker in text and "lines(" not in text]


def check(findings):
    here = os.path.abspath(__file__)
    by_kind = {}
    for finding in findings:
        by_kind.setdefault(finding.kind, []).append(finding)
        print(finding)
    leak_sites = {f"{here}:{n}" for n in lines("# LEAK-ALLOC")}
    retained = {f.site for f in by_kind.get("retained_per_step", [])}
    assert retained & leak_sites, f"no retained_per_step at {sorted(leak_sites)}: {sorted(retained)}"
    syncs = {f.site for f in by_kind.get("sync_in_loop", [])}
    for bug in ("# BUG-2", "# BUG-3"):
        site = f"{here}:{lines(bug)[0]}"
        assert site in syncs, f"{bug}: no sync_in_loop at {site}: {sorted(syncs)}"
    print("check: every planted bug is named at its Python line")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["attach", "attach-nostacks", "use_allocator", "plain"],
                        default="attach")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bugs", choices=["on", "off"], default="on")
    parser.add_argument("--check", action="store_true", help="assert the findings name the bugs")
    parser.add_argument("--time", action="store_true", help="print the mean step time")
    parser.add_argument("--snapshot", help="write the snapshot here at the end")
    parser.add_argument("--listen", metavar="ADDR",
                        help="publish live telemetry on ADDR (unix:PATH or tcp:127.0.0.1:PORT) "
                             "and wait at the end for a dashboard to get the run (attach modes)")
    args = parser.parse_args()
    if args.listen and not args.mode.startswith("attach"):
        parser.error("--listen needs --mode attach or attach-nostacks")
    session = None
    if args.mode == "attach":
        session = vramscope.attach(listen=args.listen)
    elif args.mode == "attach-nostacks":
        session = vramscope.attach(listen=args.listen, stacks=False, catch_syncs=False)
    elif args.mode == "use_allocator":
        vramscope.use_allocator()
    losses, times = train(args.steps, args.bugs == "on")
    if args.listen:
        wait_for_dashboard(session)
    if args.time:
        warm = times[len(times) // 4:]
        print(f"step_ms={1000 * sum(warm) / len(warm):.3f} mode={args.mode}")
    if args.mode == "plain":
        return 0
    if args.snapshot:
        vramscope.snapshot(args.snapshot)
    findings = vramscope.report()
    if args.check:
        check(findings)
    else:
        for finding in findings:
            print(finding)
    del losses
    return 0


if __name__ == "__main__":
    sys.exit(main())
