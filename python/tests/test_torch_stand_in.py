"""The torch glue without torch: the sync recorder that turns PyTorch's sync-debug warnings
into sync_in_loop findings at the Python line (the only part of `_torch` that runs without a
GPU), and `use_allocator()` refusing cleanly where torch is absent."""

import importlib.util
import os
import warnings

import pytest

import vramscope
from vramscope._torch import SyncRecorder
from conftest import line_of

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
