"""The `vramscope` command pip installs: it runs the Rust command line, which reads the
snapshots the Python package writes and names the Python line."""

import os
import shutil
import subprocess
import sys

import vramscope
from conftest import line_of, names_site

HERE = os.path.abspath(__file__)


def command():
    found = shutil.which("vramscope", path=os.path.dirname(sys.executable))
    assert found, "the vramscope console script is not installed next to this Python"
    return found


def test_help_runs():
    out = subprocess.run([command(), "--help"], capture_output=True, text=True, check=True)
    assert "GPU memory debugger" in out.stdout
    for subcommand in ("report", "top", "demo", "replay"):
        assert subcommand in out.stdout


def test_report_on_a_python_snapshot_names_the_python_line(tmp_path):
    alloc = vramscope.SimAllocator("2 GiB")
    kept = []
    for _ in range(10):
        alloc.mark_step()
        kept.append(alloc.alloc(2 << 20))  # CLI-LEAK
    path = tmp_path / "run.json"
    alloc.snapshot(str(path))
    out = subprocess.run([command(), "report", str(path), "--fail-on", "error"],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert names_site(out.stdout, HERE, line_of(HERE, "# CLI-LEAK")), out.stdout
    assert "retained_per_step" in out.stdout


def test_demo_listen_publishes_telemetry_that_top_can_read(tmp_path):
    sock = tmp_path / "demo.sock"
    demo = subprocess.Popen([command(), "demo", "--listen", f"unix:{sock}", "--steps", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import socket
        import time

        deadline = time.time() + 30
        while not sock.exists():
            assert demo.poll() is None, demo.communicate()
            assert time.time() < deadline, "the demo never opened its socket"
            time.sleep(0.05)
        client = socket.socket(socket.AF_UNIX)
        client.settimeout(10)
        client.connect(str(sock))
        data = b""
        while len(data) < 8:
            chunk = client.recv(65536)
            assert chunk, "the publisher closed without sending a frame"
            data += chunk
        client.close()
        # A frame: magic "VS", version, kind, then a little-endian length; the hello is JSON.
        assert data[:2] == b"VS"
        assert b'"protoc' in data[:64]
        _, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, err
    assert f"watch it with `vramscope top unix:{sock}`" in err
