"""`vramscope.load()` on hostile inputs (issue 44, item 5): it reads and analyses a file without
the GIL, so the interpreter's other threads run meanwhile and Ctrl-C raises KeyboardInterrupt
at once, and it refuses what is not a regular file (a FIFO with no writer once blocked the
interpreter for ten minutes) with a ValueError saying so."""

import _thread
import gzip
import os
import signal
import threading
import time

import pytest

import vramscope


def slow_file(tmp_path):
    """Gzip members of zeros, concatenated: 8 GiB unpacked from a few MB, which the importer
    unpacks up to its 4 GiB limit before it refuses them, seconds of work."""
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=1)
    path = tmp_path / "zeros.json.gz"
    with open(path, "wb") as out:
        for _ in range(128):
            out.write(member)
    return path


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
    reason="SIGINT is ignored in this process (started in the background without job "
    "control), so Ctrl-C cannot reach it and interrupt_main() does nothing",
)
def test_ctrl_c_stops_a_long_load_at_once_and_other_threads_run(tmp_path):
    path = slow_file(tmp_path)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    thread = threading.Thread(target=ticker)
    thread.start()
    timer = threading.Timer(0.3, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            vramscope.load(str(path))
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        timer.cancel()
        thread.join()
    # The interrupt came at 0.3 s; without the fix it waited for the whole unpacking.
    assert elapsed < 1.5, f"KeyboardInterrupt after {elapsed:.2f} s"
    during = [t for t in ticks if started <= t <= started + 0.3]
    assert len(during) >= 10, f"the other thread ran {len(during)} times in 0.3 s"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_a_value_error_saying_so(tmp_path):
    fifo = tmp_path / "trace.pickle"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="FIFO"):
        vramscope.load(str(fifo))


def test_a_device_is_a_value_error_saying_so():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    with pytest.raises(ValueError, match="a device"):
        vramscope.load("/dev/zero")


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links here")
def test_a_snapshot_is_never_written_through_a_link(tmp_path):
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    link = tmp_path / "run.json"
    os.symlink(precious, link)
    alloc = vramscope.SimAllocator("1 GiB")
    kept = alloc.alloc(1 << 20)
    alloc.snapshot(str(link))
    assert precious.read_text() == "keep me"
    assert not link.is_symlink() and link.stat().st_size > 100
    assert vramscope.load(link).peak_allocated >= 1 << 20
    del kept


def test_text_from_a_file_reaches_no_ci_runner_through_python(tmp_path):
    """A site named with a line break and GitHub workflow commands: the summary and each
    finding's text, printed in a CI job, hold no line break of the file's, no line that starts
    with `::` and no `##[` (issue 44, items 3 and 4)."""
    import json

    alloc = vramscope.SimAllocator("2 GiB")
    kept = []
    for _ in range(6):
        alloc.mark_step()
        kept.append(alloc.alloc(4 << 20))
    path = tmp_path / "run.json"
    alloc.snapshot(str(path))
    snap = json.loads(path.read_text())
    hostile = "BEFORE\n::add-mask::AFTER\r\n  ::stop-commands::t\n##[set-output name=x;]y"
    for site in snap["sites"]:
        site["file"] = hostile + ".py"
        site["frames"] = []
    path.write_text(json.dumps(snap))
    report = vramscope.load(path)
    assert report.findings, "the leak is found"
    texts = [report.summary()] + [f.text for f in report.findings] + [str(f) for f in report.findings]
    for text in texts:
        assert "##[" not in text and "\r" not in text, text
        for line in text.splitlines():
            assert not line.lstrip(" \t").startswith("::"), line
            assert "AFTER" not in line or "BEFORE" in line, line
    # The values themselves stay the file's own text.
    assert any(f.site and f.site.startswith(hostile) for f in report.findings)
    del kept
