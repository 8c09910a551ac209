"""The torch glue without torch: the sync recorder that turns PyTorch's sync-debug warnings
into sync events at the Python line, merged into the snapshots of `attach()` (through the
stand-in torch of `stand_in/`) and of the pluggable allocator (called through ctypes), where
the inspector's sync_in_loop detector reports them; and `use_allocator()` refusing cleanly
where torch is absent."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import vramscope
from vramscope._torch import SyncRecorder
from conftest import line_of, names_site

HERE = os.path.abspath(__file__)


def fake_item():
    # What torch does on `.item()` under set_sync_debug_mode("warn"): a UserWarning raised
    # from C++, attributed to the calling Python line.
    warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)


def test_sync_warnings_become_findings_at_the_calling_line_and_are_not_shown(capsys):
    recorder = SyncRecorder()
    saved = warnings.showwarning
    with warnings.catch_warnings():
        recorder.install()
        try:
            for step in range(1, 5):
                recorder.mark_step(step)
                for _ in range(3):
                    fake_item()  # SYNC-LINE
                warnings.warn("something else")  # OTHER-WARNING
        finally:
            warnings.showwarning = saved
    findings = recorder.findings()
    assert [f.site for f in findings] == [f"{HERE}:{line_of(HERE, '# SYNC-LINE')}"]
    assert findings[0].count == 12 and findings[0].severity == "warning"
    assert findings[0].function == "test_sync_warnings_become_findings_at_the_calling_line_and_are_not_shown"
    assert "synchroniz" not in capsys.readouterr().err
    message = recorder.check(2)
    assert message and "3 times (limit 2)" in message and "SYNC" not in message
    assert f":{line_of(HERE, '# SYNC-LINE')}" in message
    assert recorder.check(3) is None


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_use_allocator_without_torch_says_it_needs_torch():
    with pytest.raises(RuntimeError, match="need torch"):
        vramscope.use_allocator()
    assert vramscope.active() is None


def test_one_sync_per_step_is_no_finding_but_is_counted():
    recorder = SyncRecorder()
    saved = warnings.showwarning
    with warnings.catch_warnings():
        recorder.install()
        try:
            for step in range(1, 6):
                recorder.mark_step(step)
                fake_item()  # ONCE-PER-STEP
        finally:
            warnings.showwarning = saved
    # Reading a value once per step is the advice itself (issue 43): no finding, but the waits
    # are counted and a limit below them fails.
    findings = recorder.findings()
    assert [f for f in findings if f.kind == "sync_in_loop"] == []
    assert recorder.check(1) is None
    assert recorder.check(0) is not None
    assert recorder.log.syncs == 5


STAND_IN = os.path.join(os.path.dirname(HERE), "stand_in")


def run_with_stand_in(tmp_path, source, *args, env=None):
    """Runs ``source`` as a script in a child Python whose ``import torch`` is the stand-in."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    child_env = dict(os.environ, PYTHONPATH=STAND_IN, VRAMSCOPE_BACKEND="sim", **(env or {}))
    out = subprocess.run([sys.executable, str(script), *map(str, args)], env=child_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return script, out


ATTACH_SYNCS = '''
    import json, sys
    import torch
    import vramscope

    session = vramscope.attach()
    optimizer = torch.optim.Optimizer()
    kept = []
    for step in range(6):
        x = torch.empty(1 << 20)
        for _ in range(3):
            x.item()  # ATTACH-SYNC
        kept.append(torch.empty(1 << 20))
        del x
        optimizer.step()
    vramscope.snapshot(sys.argv[1])
    print(json.dumps({
        "findings": [[f.kind, f.site, f.severity, f.count, f.function]
                     for f in vramscope.report()],
        "check": session.check(max_syncs_per_step=2),
        "report": vramscope.report_text(),
    }))
'''


def test_attach_merges_the_sync_warnings_into_the_snapshot_at_their_line(tmp_path):
    snap_path = tmp_path / "run.json"
    script, out = run_with_stand_in(tmp_path, ATTACH_SYNCS, snap_path)
    assert "synchroniz" not in out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    site = f"{script}:{line_of(script, '# ATTACH-SYNC')}"
    syncs = [f for f in result["findings"] if f[0] == "sync_in_loop"]
    # Steps 1 to 5 (the first iteration runs before the first optimizer step, in step 0).
    assert syncs == [["sync_in_loop", site, "warning", 15, "<module>"]], result["findings"]
    assert len(result["check"]) == 1
    assert "waited for the device 3 times (limit 2), 3 of them at " + site in result["check"][0]
    assert "sync_in_loop" in result["report"]
    assert names_site(result["report"], script, line_of(script, "# ATTACH-SYNC")), result["report"]
    # A .json snapshot is vramscope's, converted from PyTorch's with the syncs in it, each in
    # the step PyTorch's annotations number.
    snap = json.loads(snap_path.read_text())
    events = [e for e in snap["events"] if e["kind"] == "sync"]
    assert len(events) == 18
    assert {snap["sites"][e["site"]]["line"] for e in events} == {line_of(script, "# ATTACH-SYNC")}
    assert sorted(e["step"] for e in events) == sorted([0] * 3 + [1, 2, 3, 4, 5] * 3)


PLUGGABLE_SYNCS = '''
    import ctypes, json, sys, warnings
    import vramscope
    from vramscope import _native
    from vramscope._torch import SyncRecorder

    lib = ctypes.CDLL(vramscope.native_library_path())
    lib.vramscope_malloc.restype = ctypes.c_void_p
    lib.vramscope_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    recorder = SyncRecorder()
    recorder.install()

    def item():
        warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)

    kept = []
    for step in range(1, 6):
        _native.device_mark_step()
        recorder.mark_step(step)
        kept.append(lib.vramscope_malloc(1 << 20, 0, None))
        for _ in range(4):
            item()  # PLUGGABLE-SYNC
    _native.device_snapshot(0, sys.argv[1], recorder.log)
    print(json.dumps({
        "findings": [[f.kind, f.site, f.severity, f.count]
                     for f in _native.device_findings(0, recorder.log)],
        "check": _native.device_check(0, None, False, 3, recorder.log),
        "without_log": _native.device_check(0, None, False, 3),
    }))
'''


def test_use_allocator_snapshots_hold_the_syncs_in_the_allocator_steps(tmp_path):
    snap_path = tmp_path / "run.json"
    script, out = run_with_stand_in(tmp_path, PLUGGABLE_SYNCS, snap_path)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    site = f"{script}:{line_of(script, '# PLUGGABLE-SYNC')}"
    assert [f for f in result["findings"] if f[0] == "sync_in_loop"] == [
        ["sync_in_loop", site, "warning", 20]]
    assert len(result["check"]) == 1 and "4 times (limit 3)" in result["check"][0]
    assert site in result["check"][0]
    assert result["without_log"] == []
    snap = json.loads(snap_path.read_text())
    syncs = [e for e in snap["events"] if e["kind"] == "sync"]
    assert sorted(e["step"] for e in syncs) == sorted(list(range(1, 6)) * 4)
    assert [e["seq"] for e in snap["events"]] == list(
        range(snap["events"][0]["seq"], snap["events"][0]["seq"] + len(snap["events"])))
    marks = {m["step"]: m["seq"] for m in snap["steps"]}
    by_seq = {e["seq"]: e for e in snap["events"]}
    for step, seq in marks.items():
        assert by_seq[seq]["step"] == step


ATTACH_LIVE = '''
    import json, sys, threading, time
    import torch
    import vramscope
    from vramscope import _native

    addr = "unix:" + sys.argv[1]
    session = vramscope.attach(listen=addr)
    optimizer = torch.optim.Optimizer()
    kept = []
    for step in range(3):
        kept.append(torch.empty(3 << 20))  # LIVE-ALLOC
        optimizer.step()
    # A dashboard attaches after the fact: the history so far comes with its snapshot.
    first = json.loads(_native.read_telemetry(addr, 3.0))

    # Another stays attached while the program runs on: the new allocations stream to it.
    second = {}
    reader = threading.Thread(
        target=lambda: second.update(json.loads(_native.read_telemetry(addr, 20.0))))
    before = session.live.counters()["snapshots"]
    reader.start()

    def wait_for(what, done):
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    wait_for("no snapshot for the second dashboard",
             lambda: session.live.counters()["snapshots"] > before)
    kept.append(torch.empty(1 << 20))  # LIVE-STREAM
    optimizer.step()
    wait_for("the new allocation never streamed",
             lambda: session.live.counters()["events_sent"] > 0)
    session.close()
    reader.join(10)
    print(json.dumps({"first": first, "second": second, "errors": session.feeder is None}))
'''


def test_attach_publishes_live_telemetry_that_a_dashboard_reads(tmp_path):
    sock = tmp_path / "run.sock"
    script, out = run_with_stand_in(tmp_path, ATTACH_LIVE, sock)
    assert f"watch it with `vramscope top unix:{sock}`" in out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    first, second = result["first"], result["second"]
    assert first["hello"]["device"]["name"] == "Stand-in GPU"
    assert first["hello"]["device"]["capacity"] == 80 << 30
    # The snapshot a late dashboard gets holds the history: the three allocations at their
    # Python line, each in the step the optimizer hook numbered.
    assert first["snapshots"], first
    alloc_site = f"{script}:{line_of(script, '# LIVE-ALLOC')}"
    allocs = [e for e in first["events"] if e["kind"] == "alloc"]
    assert [(e["site"], e["step"], e["in_snapshot"]) for e in allocs] == [
        (alloc_site, step, True) for step in range(3)]
    assert first["snapshots"][0]["steps"] == [1, 2, 3]
    # memory_stats() figures, ten times a second.
    assert any(s["allocated"] == 9 << 20 and s["step"] == 3 for s in first["stats"]), first["stats"]
    assert len(first["stats"]) >= 5
    # The attached dashboard got the new allocation as an event (with its call site sent in a
    # table first), in step 3, and the goodbye when the session closed.
    stream_site = f"{script}:{line_of(script, '# LIVE-STREAM')}"
    streamed = [e for e in second["events"] if not e["in_snapshot"] and e["kind"] == "alloc"]
    assert [(e["site"], e["step"]) for e in streamed] == [(stream_site, 3)], second["events"]
    assert any(s["allocated"] == 10 << 20 for s in second["stats"])
    assert second["ended"] == "bye"
    assert all(s["dropped"] == 0 for s in first["stats"] + second["stats"])
    assert not sock.exists()


def test_a_publisher_without_history_still_greets_and_sends_statistics():
    from vramscope import _native

    with pytest.raises(ValueError, match="loopback"):
        _native.LivePublisher("tcp:0.0.0.0:0")
    publisher = _native.LivePublisher("tcp:127.0.0.1:0", 3, "Test GPU", 1 << 30)
    try:
        assert publisher.addr.startswith("tcp:127.0.0.1:") and not publisher.addr.endswith(":0")
        publisher.stats({"allocated_bytes.all.current": 5 << 20, "reserved_bytes.all.peak": 7 << 20,
                         "num_ooms": 2, "not.a.figure": "x"}, 4)
        # No history call comes: the dashboard gets an empty snapshot after a second.
        seen = json.loads(_native.read_telemetry(publisher.addr, 1.6))
    finally:
        publisher.close()
    assert seen["hello"]["device"]["index"] == 3
    assert seen["snapshots"] and seen["snapshots"][0]["history"] == 0
    assert seen["stats"] and seen["stats"][-1]["allocated"] == 5 << 20
    assert seen["stats"][-1]["step"] == 4
