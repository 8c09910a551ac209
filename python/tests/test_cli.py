"""The `vramscope` command pip installs: it runs the Rust command line, which reads the
snapshots the Python package writes and names the Python line."""

import os
import shutil
import subprocess
import sys

import vramscope
from conftest import line_of

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
    assert f"{HERE}:{line_of(HERE, '# CLI-LEAK')}" in out.stdout
    assert "retained_per_step" in out.stdout
