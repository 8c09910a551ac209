"""``vramscope run -- python train.py``: an unmodified script, watched. The script below never
imports vramscope; run under the command (torch is the stand-in of ``stand_in/``), it gets a
snapshot at exit and at its out-of-memory error, the report's verdict naming its leaking line,
and its own exit status back."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import line_of, names_site
from test_torch_stand_in import STAND_IN

SCRIPT = '''
    import sys
    import torch

    optimizer = torch.optim.Optimizer()
    history = []
    for step in range(12):
        activations = torch.empty(8 << 20)
        loss = torch.empty(1 << 20)  # LEAK: made here, kept by the list
        history.append(loss)
        del activations
        optimizer.step()
    if "--oom" in sys.argv:
        huge = torch.empty(1 << 40)  # OOM
    sys.exit(int(sys.argv[1]))
'''


def command():
    found = shutil.which("vramscope", path=os.path.dirname(sys.executable))
    assert found, "the vramscope console script is not installed next to this Python"
    return found


def run(tmp_path, argv, env=None):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    child_env = dict(os.environ, PYTHONPATH=STAND_IN, **(env or {}))
    child_env.pop("VRAMSCOPE_RUN_CONFIG", None)
    out = subprocess.run([a if a != "SCRIPT" else str(script) for a in argv], cwd=tmp_path,
                         env=child_env, capture_output=True, text=True, timeout=180)
    return script, out


def test_an_unmodified_script_gets_a_snapshot_a_verdict_and_its_exit_status(tmp_path):
    snapshot = tmp_path / "run.pickle"
    script, out = run(tmp_path, [command(), "run", "--snapshot", str(snapshot), "--",
                                 sys.executable, "SCRIPT", "3"])
    assert out.returncode == 3, out.stdout + out.stderr
    assert snapshot.is_file(), out.stderr
    leak = f"{script}:{line_of(script, '# LEAK')}"
    assert "exited with status 3" in out.stderr
    assert f"retained_per_step at {leak}" in out.stderr, out.stderr
    assert f"vramscope report {snapshot}" in out.stderr
    # The snapshot is the script's: the command line reads it and names the same line.
    report = subprocess.run([command(), "report", str(snapshot)], capture_output=True,
                            text=True, timeout=120)
    assert names_site(report.stdout, script, line_of(script, "# LEAK")), report.stdout + report.stderr


def test_an_out_of_memory_death_leaves_both_snapshots_and_its_status(tmp_path):
    snapshot = tmp_path / "run.pickle"
    script, out = run(tmp_path, [command(), "run", "--snapshot", str(snapshot), "--",
                                 sys.executable, "SCRIPT", "0", "--oom"],
                      env={"STAND_IN_CAPACITY": str(1 << 30)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "OutOfMemoryError" in out.stderr
    oom = tmp_path / "run-oom.pickle"
    assert oom.is_file() and snapshot.is_file(), out.stderr
    assert f"snapshot at the out-of-memory error: {oom}" in out.stderr
    assert f"retained_per_step at {script}:{line_of(script, '# LEAK')}" in out.stderr


def test_python_dash_m_runs_the_script_with_this_python(tmp_path):
    snapshot = tmp_path / "snap.pickle"
    script, out = run(tmp_path, [sys.executable, "-m", "vramscope", "run", "--snapshot",
                                 str(snapshot), "SCRIPT", "0"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"retained_per_step at {script}:{line_of(script, '# LEAK')}" in out.stderr
    # After `--` the command is given whole, interpreter included.
    script, out = run(tmp_path, [sys.executable, "-m", "vramscope", "run", "--snapshot",
                                 str(snapshot), "--", sys.executable, "SCRIPT", "4"])
    assert out.returncode == 4, out.stdout + out.stderr
    assert f"retained_per_step at {script}:{line_of(script, '# LEAK')}" in out.stderr


def test_ctrl_c_to_the_command_leaves_the_script_to_finish_and_the_verdict_said(tmp_path):
    import signal
    import time

    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(3)\nprint('finished')\n")
    runner = subprocess.Popen([command(), "run", "--snapshot", str(tmp_path / "slow.pickle"),
                               "--", sys.executable, str(script)], cwd=tmp_path,
                              env=dict(os.environ, PYTHONPATH=STAND_IN),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Wait until the command ignores SIGINT (its script is running), as the kernel says.
    status = f"/proc/{runner.pid}/status"
    if not os.path.exists(status):
        runner.communicate(timeout=120)
        pytest.skip("no /proc here to see when the command ignores SIGINT")
    deadline = time.monotonic() + 60
    while True:
        with open(status) as f:
            ignored = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
        if ignored & (1 << (signal.SIGINT - 1)):
            break
        assert time.monotonic() < deadline, "the command never ignored SIGINT"
        time.sleep(0.02)
    runner.send_signal(signal.SIGINT)  # to the command alone, not the script
    out, err = runner.communicate(timeout=120)
    assert runner.returncode == 0, out + err
    assert "finished" in out
    assert "exited with status 0" in err


def test_a_script_that_cannot_start_is_said_and_its_status_passed_through(tmp_path):
    out = subprocess.run([command(), "run", "--snapshot", str(tmp_path / "x.pickle"), "--",
                          sys.executable, "-c", "raise SystemExit(7)"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=STAND_IN))
    assert out.returncode == 7, out.stderr
    assert "exited with status 7" in out.stderr
    missing = subprocess.run([command(), "run", "--", str(tmp_path / "no-such-program")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert "cannot run" in missing.stderr
