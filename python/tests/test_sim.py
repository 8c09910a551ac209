"""SimAllocator from Python: the Python stack as the call site, findings at the Python line,
scopes, steps, frees, errors, and the pluggable allocator's C entry points."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import vramscope
from conftest import line_of

HERE = os.path.abspath(__file__)


def block_site(alloc, block):
    """The call site (a dict of the snapshot's site table) of a live block."""
    snap = json.loads(alloc.snapshot_json())
    for segment in snap["segments"]:
        for b in segment["blocks"]:
            if b["address"] == block.addr and b["state"] == "active_allocated":
                return snap["sites"][b["site"]], b, snap
    raise AssertionError(f"block {block!r} not in the snapshot")


def allocate_here(alloc):
    return alloc.alloc(1 << 20)  # ALLOC-IN-FUNCTION


def test_an_allocation_records_the_python_function_and_line():
    alloc = vramscope.SimAllocator("1 GiB")
    block = allocate_here(alloc)
    site, _, _ = block_site(alloc, block)
    assert site["file"] == HERE
    assert site["line"] == line_of(HERE, "# ALLOC-IN-FUNCTION")
    assert site["function"] == "allocate_here"
    # The whole stack is kept, innermost first: the caller is the next frame.
    assert site["frames"][0]["function"] == "allocate_here"
    assert site["frames"][1]["function"] == "test_an_allocation_records_the_python_function_and_line"
    assert site["frames"][1]["file"] == HERE


def test_one_line_reached_through_two_callers_is_two_stacks_with_one_line():
    alloc = vramscope.SimAllocator("1 GiB")

    def first():
        return allocate_here(alloc)

    def second():
        return allocate_here(alloc)

    a, b = first(), second()
    site_a, _, _ = block_site(alloc, a)
    site_b, _, _ = block_site(alloc, b)
    assert (site_a["file"], site_a["line"]) == (site_b["file"], site_b["line"])
    assert site_a["frames"][1]["function"] == "first"
    assert site_b["frames"][1]["function"] == "second"


def two_lines(alloc):
    first = alloc.alloc(4096)  # FIRST-OF-TWO
    second = alloc.alloc(4096)  # SECOND-OF-TWO
    return first, second


def test_a_loop_hits_the_stack_cache_and_keeps_each_line_apart():
    # On 3.11+ stacks are keyed by instruction offset: a hit must still tell two lines of one
    # function apart, and a repeat must intern nothing new.
    alloc = vramscope.SimAllocator("1 GiB")
    for round in range(3):
        before = vramscope._native.cached_stacks()
        first, second = two_lines(alloc)
        site_a, raw_a, _ = block_site(alloc, first)
        site_b, raw_b, _ = block_site(alloc, second)
        assert site_a["line"] == line_of(HERE, "# FIRST-OF-TWO")
        assert site_b["line"] == line_of(HERE, "# SECOND-OF-TWO")
        assert raw_a["site"] != raw_b["site"]
        if round > 0:
            assert vramscope._native.cached_stacks() == before


def test_two_calls_on_one_line_share_one_site():
    # Two allocations of one line are two instruction offsets but one call site.
    alloc = vramscope.SimAllocator("1 GiB")
    before = vramscope._native.cached_stacks()
    pair = (alloc.alloc(4096), alloc.alloc(8192))  # TWO-OFFSETS
    assert vramscope._native.cached_stacks() == before + 1
    site_a, raw_a, _ = block_site(alloc, pair[0])
    _, raw_b, _ = block_site(alloc, pair[1])
    assert raw_a["site"] == raw_b["site"]
    assert site_a["line"] == line_of(HERE, "# TWO-OFFSETS")
    if sys.version_info >= (3, 11):
        assert vramscope._native.stack_keyed_by_offset()


def test_without_stack_capture_the_site_is_the_native_module():
    alloc = vramscope.SimAllocator("1 GiB", capture_stacks=False)
    site, _, _ = block_site(alloc, allocate_here(alloc))
    assert site["file"].endswith("sim.rs"), site


def test_a_list_that_keeps_a_block_per_step_is_retained_per_step_at_its_line():
    alloc = vramscope.SimAllocator("4 GiB")
    losses = []
    for _ in range(12):
        alloc.mark_step()
        activations = alloc.alloc(8 << 20)
        losses.append(alloc.alloc(1 << 20))  # LEAKING-LINE
        activations.free()
    findings = alloc.report()
    retained = [f for f in findings if f.kind == "retained_per_step"]
    assert len(retained) == 1, [str(f) for f in findings]
    leak = retained[0]
    assert leak.site == f"{HERE}:{line_of(HERE, '# LEAKING-LINE')}"
    assert leak.function == "test_a_list_that_keeps_a_block_per_step_is_retained_per_step_at_its_line"
    assert leak.bytes_per_step == pytest.approx(1 << 20)
    assert leak.site in leak.text and "Fix:" in leak.text
    # The freed activations are not a leak, and the text report says the same.
    assert "retained_per_step" in alloc.report_text()


def test_a_loop_that_frees_what_it_allocates_has_no_leak():
    alloc = vramscope.SimAllocator("4 GiB")
    for _ in range(12):
        alloc.mark_step()
        kept = alloc.alloc(1 << 20)
        del kept
    assert [f for f in alloc.report() if f.kind == "retained_per_step"] == []
    assert alloc.allocated == 0
    assert alloc.check(no_leaks=True) == []


def test_blocks_free_on_drop_and_on_free_and_only_once():
    alloc = vramscope.SimAllocator("1 GiB")
    a = alloc.alloc(3 << 20)
    b = alloc.alloc(1 << 20)
    assert alloc.allocated == (3 << 20) + (1 << 20)
    a.free()
    assert a.freed and alloc.allocated == 1 << 20
    a.free()  # a second free does nothing
    del b
    assert alloc.allocated == 0
    assert alloc.peak_allocated == 4 << 20
    assert alloc.reserved > 0  # cached, as PyTorch does
    assert alloc.empty_cache() > 0 and alloc.reserved == 0


def test_stats_and_findings_are_python_objects_made_by_the_core():
    alloc = vramscope.SimAllocator("1 GiB")
    kept = []
    for _ in range(6):
        alloc.mark_step()
        kept.append(alloc.alloc(1 << 20))
    stats = alloc.stats()
    assert isinstance(stats, dict)
    assert stats["allocated_bytes"]["all"]["current"] == alloc.allocated == 6 << 20
    assert stats["allocated_bytes"]["all"]["peak"] == alloc.peak_allocated
    findings = alloc.report()
    assert findings and all(isinstance(f, vramscope.Finding) for f in findings)
    assert findings == alloc.report()  # the same findings compare equal
    report = alloc.inspect()
    assert isinstance(report, vramscope.Report)
    assert report.peak_allocated == alloc.peak_allocated
    assert [f.text for f in report.findings] == [f.text for f in findings]


def test_scopes_nest_and_name_their_allocations():
    alloc = vramscope.SimAllocator("1 GiB")
    with alloc.scope("forward"):
        outer = alloc.alloc(4096)
        with alloc.scope("attention"):
            inner = alloc.alloc(4096)
    after = alloc.alloc(4096)
    snap = json.loads(alloc.snapshot_json())
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    scope_of = lambda blk: snap["scopes"][blocks[blk.addr]["scope"]] if blocks[blk.addr].get("scope") is not None else None  # noqa: E731
    assert scope_of(outer) == "forward"
    assert scope_of(inner) == "forward/attention"
    assert scope_of(after) is None


def test_steps_count_and_stamp_allocations():
    alloc = vramscope.SimAllocator("1 GiB")
    assert alloc.step == 0
    assert [alloc.mark_step() for _ in range(3)] == [1, 2, 3]
    block = alloc.alloc(4096)
    _, raw, snap = block_site(alloc, block)
    assert raw["step"] == 3
    assert [s["step"] for s in snap["steps"]] == [1, 2, 3]


def test_the_module_functions_act_on_the_activated_allocator(tmp_path):
    alloc = vramscope.SimAllocator("1 GiB")
    previous = vramscope.activate(alloc)
    try:
        vramscope.mark_step()
        with vramscope.scope("eval"):
            kept = alloc.alloc(2 << 20)
        path = vramscope.snapshot(str(tmp_path / "run.json"))
        assert json.load(open(path))["stats"]["allocated_bytes"]["all"]["current"] == 2 << 20
        assert "Allocated memory" in vramscope.memory_summary()
        assert isinstance(vramscope.report(), list)
        del kept
    finally:
        vramscope.activate(previous)
    with pytest.raises(RuntimeError, match="not active"):
        vramscope.mark_step()


def test_out_of_memory_is_a_memory_error_naming_the_request():
    alloc = vramscope.SimAllocator("64 MiB")
    keep = alloc.alloc(40 << 20)
    with pytest.raises(MemoryError, match="out of memory"):
        alloc.alloc(40 << 20)
    assert keep.nbytes == 40 << 20


def test_framework_frames_are_never_the_site(tmp_path):
    # A helper that lives in site-packages (as torch does) allocates for the test: the site
    # is the test's line that called it, and the helper's frame is kept in the stack.
    lib = tmp_path / "site-packages" / "fakelib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("def make(alloc):\n    return alloc.alloc(4096)\n")
    sys.path.insert(0, str(tmp_path / "site-packages"))
    try:
        import fakelib

        alloc = vramscope.SimAllocator("1 GiB")
        block = fakelib.make(alloc)  # THROUGH-FRAMEWORK
        site, _, _ = block_site(alloc, block)
    finally:
        sys.path.remove(str(tmp_path / "site-packages"))
    assert (site["file"], site["line"]) == (HERE, line_of(HERE, "# THROUGH-FRAMEWORK"))
    assert site["frames"][0]["file"].endswith(os.path.join("fakelib", "__init__.py"))


def test_deep_stacks_are_cut_at_the_depth_limit():
    alloc = vramscope.SimAllocator("1 GiB")

    def recurse(n):
        return recurse(n - 1) if n else alloc.alloc(4096)

    depth = vramscope._native.stack_depth()
    vramscope.set_stack_depth(5)
    try:
        site, _, _ = block_site(alloc, recurse(20))
    finally:
        vramscope.set_stack_depth(depth)
    assert len(site["frames"]) == 5
    assert all(f["function"] == "recurse" for f in site["frames"])


def test_parse_size():
    assert vramscope.parse_size("2 GiB") == 2 << 30
    # Binary units throughout, as GPU memory is sold and as the command line reads them.
    assert vramscope.parse_size("512MB") == 512 << 20
    assert vramscope.parse_size("24GB") == 24 << 30
    assert vramscope.parse_size("1.5G") == 3 << 29
    assert vramscope.parse_size(4096) == 4096
    for bad in ("lots", "12 parsecs", "-1", "", -1, True):
        with pytest.raises(ValueError):
            vramscope.parse_size(bad)


PLUGGABLE = textwrap.dedent('''
    import ctypes, json, sys
    import vramscope
    from vramscope import _native

    mode, loader = sys.argv[1], sys.argv[2]
    _native.set_stack_mode(mode)
    # PyDLL keeps the GIL during the call (as a torch op that does not release it);
    # CDLL releases it (as torch's bindings do around an operation).
    lib = getattr(ctypes, loader)(vramscope.native_library_path())
    lib.vramscope_malloc.restype = ctypes.c_void_p
    lib.vramscope_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.vramscope_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

    def forward():
        return lib.vramscope_malloc(1 << 20, 0, None)  # PLUGGABLE-MALLOC

    kept = forward()
    freed = lib.vramscope_malloc(4096, 0, None)
    lib.vramscope_free(freed, 4096, 0, None)
    _native.device_snapshot(0, sys.argv[3])
    print(json.dumps({"kept": kept, "errors": _native.errors()[0]}))
''')


@pytest.mark.parametrize("mode,loader,captured", [
    ("python", "PyDLL", True),   # the GIL is held: walked
    ("python", "CDLL", True),    # the GIL was released by the caller: taken back to walk
    ("held", "CDLL", False),     # the GIL was released and the mode never takes it
    ("off", "PyDLL", False),
])
def test_the_pluggable_allocator_records_the_python_line(tmp_path, mode, loader, captured):
    script = tmp_path / "pluggable.py"
    script.write_text(PLUGGABLE)
    snap_path = tmp_path / "snap.json"
    env = dict(os.environ, VRAMSCOPE_BACKEND="sim")
    out = subprocess.run([sys.executable, str(script), mode, loader, str(snap_path)],
                         env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, out.stderr
    snap = json.loads(snap_path.read_text())
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert [b["address"] for b in blocks] == [result["kept"]]
    site = snap["sites"][blocks[0]["site"]]
    if captured:
        assert (site["file"], site["line"], site["function"]) == (
            str(script), line_of(script, "# PLUGGABLE-MALLOC"), "forward")
    else:
        assert site["file"].endswith("pluggable.rs"), site


NATIVE_THREAD = '''
    import json, sys
    from vramscope import _native

    _native.set_native_stacks(1)
    sampled = _native.alloc_on_native_thread(0, 1 << 20)
    _native.set_native_stacks(0)
    unsampled = _native.alloc_on_native_thread(0, 4096)
    _native.device_snapshot(0, sys.argv[1])
    print(json.dumps({"sampled": sampled, "unsampled": unsampled, "errors": _native.errors()[0],
                      "report": _native.device_report_text(0)}))
'''


def test_an_allocation_on_a_thread_without_python_is_named_by_its_native_caller(tmp_path):
    # As on autograd's backward thread: no Python frame, so the sampled native stack is the
    # site, symbolized from the allocator's caller outwards, and the report names the stack by
    # the autograd node it runs in.
    script = tmp_path / "native.py"
    script.write_text(textwrap.dedent(NATIVE_THREAD))
    snap_path = tmp_path / "snap.json"
    env = dict(os.environ, VRAMSCOPE_BACKEND="sim")
    out = subprocess.run([sys.executable, str(script), str(snap_path)], env=env,
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0 and result["sampled"] and result["unsampled"], out.stderr
    snap = json.loads(snap_path.read_text())
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated"}
    sampled = snap["sites"][blocks[result["sampled"]]["site"]]
    assert (sampled["file"], sampled["line"]) == ("??", 0)
    functions = [f["function"] for f in sampled["frames"]]
    assert functions and "MmBackward0::apply" in functions[0], functions
    assert not any("vramscope_malloc" in f or f.startswith("backtrace::") for f in functions)
    unsampled = snap["sites"][blocks[result["unsampled"]]["site"]]
    assert unsampled["file"].endswith("pluggable.rs"), unsampled
    assert "MmBackward0 (backward)" in result["report"], result["report"]


NATIVE_THREAD_LIVE = '''
    import json, sys, threading, time
    from vramscope import _native

    addr, snap_path = "unix:" + sys.argv[1], sys.argv[2]
    _native.set_listen(addr)
    _native.set_native_stacks(1)
    # The first allocation opens device 0, which starts publishing: made before a dashboard
    # attaches, it reaches the dashboard in the snapshot it attaches with.
    before = _native.alloc_on_native_thread(0, 1 << 20)

    seen = {}
    reader = threading.Thread(
        target=lambda: seen.update(json.loads(_native.read_telemetry(addr, 5.0))))
    reader.start()

    def snapshots_taken():
        # Each snapshot adds a "snapshot" event: the publisher's, and each one taken here.
        _native.device_snapshot(0, snap_path)
        with open(snap_path) as f:
            return sum(e["kind"] == "snapshot" for e in json.load(f)["events"])

    polls, deadline = 1, time.monotonic() + 4
    while snapshots_taken() <= polls:
        assert time.monotonic() < deadline, "the dashboard got no snapshot"
        polls += 1
        time.sleep(0.02)
    # After the dashboard's snapshot, from another native stack (a new call site): the
    # allocation streams to it, its site in a table addition.
    _native.time_native_thread_pairs(0, 2 << 20, 1)
    reader.join()
    print(json.dumps({"seen": seen, "errors": _native.errors()[0]}))
'''


def test_an_allocation_on_a_thread_without_python_reaches_a_live_dashboard_by_name(tmp_path):
    # The native stack's placeholders are named as the site leaves the allocator, so a live
    # dashboard (`vramscope top`) shows the autograd node, not raw addresses: in the snapshot
    # a dashboard attaches with, and in the tables that come with the allocations after it.
    script = tmp_path / "native_live.py"
    script.write_text(textwrap.dedent(NATIVE_THREAD_LIVE))
    env = dict(os.environ, VRAMSCOPE_BACKEND="sim")
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "live.sock"),
                          str(tmp_path / "snap.json")],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, out.stderr
    seen = result["seen"]
    assert seen["snapshots"], seen
    allocs = {e["size"]: e for e in seen["events"] if e["kind"] == "alloc"}
    before, streamed = allocs[1 << 20], allocs[2 << 20]
    assert before["in_snapshot"] and not streamed["in_snapshot"], seen["events"]
    assert before["site_id"] != streamed["site_id"], "two native stacks, two call sites"
    for event in (before, streamed):
        site = seen["sites"][event["site_id"]]
        functions = [f["function"] for f in site["frames"]]
        assert functions and "MmBackward0::apply" in functions[0], functions
        assert not any("vramscope_malloc" in f for f in functions), functions
    assert "vramscope-native-ip:" not in json.dumps(seen)
