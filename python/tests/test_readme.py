"""The README's Python example, run as a user runs it: its code block is written to
``train.py`` and run by this Python against the installed package, and the finding it
promises ("the leak: reported at this line") must name that line; the snapshot it writes must
then read with the ``vramscope`` command the package installed."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_example() -> str:
    """The first ``python`` code block of the README's "## Python" section."""
    text = README.read_text()
    section = text[text.index("\n## Python\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Python section has no python code block"
    return match.group(1)


def test_the_readme_example_names_the_leaking_line(tmp_path):
    code = python_example()
    script = tmp_path / "train.py"
    script.write_text(code)
    leak_line = next(i + 1 for i, line in enumerate(code.splitlines()) if "the leak" in line)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "retained_per_step" in out.stdout, out.stdout
    assert f"train.py:{leak_line}" in out.stdout, out.stdout
    # The example's own comment says which line it names: keep the README honest.
    assert f"train.py:{leak_line}" in code
    snapshot = tmp_path / "run.json"
    assert snapshot.is_file(), "the example's snapshot was not written"
    command = shutil.which("vramscope", path=os.path.dirname(sys.executable))
    assert command, "the vramscope console script is not installed next to this Python"
    report = subprocess.run([command, "report", str(snapshot)], capture_output=True, text=True,
                            timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"train.py:{leak_line}" in report.stdout, report.stdout
