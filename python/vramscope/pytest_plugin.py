"""pytest plugin (entry point ``pytest11``): device-memory checks on tests.

* ``@pytest.mark.vramscope(max_peak="2 GiB", no_leaks=True, max_syncs_per_step=0)`` checks
  one test; ``pytest --vramscope`` checks every test for leaks (``no_leaks=True``), and a
  marker's own limits win.
* The checks run on what is active during the test: a ``use_allocator()`` or ``attach()``
  session (a GPU run), or else a :class:`vramscope.SimAllocator` the plugin activates for the
  test (the ``vramscope_allocator`` fixture hands it to the test; without a GPU, this is
  where the test's allocations go).
* A test that breaks a limit fails with the finding's text: the Python ``file:line``, the bytes
  per step, the fix.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import pytest

import vramscope

_LIMITS = ("max_peak", "no_leaks", "max_syncs_per_step")


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("vramscope", "GPU memory checks (vramscope)")
    group.addoption("--vramscope", action="store_true", default=False,
                    help="check every test for device-memory leaks (retained_per_step)")
    group.addoption("--vramscope-capacity", default="80 GiB",
                    help="capacity of the simulated device tests get (default: 80 GiB)")


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        "vramscope(max_peak=None, no_leaks=False, max_syncs_per_step=None): fail the test "
        "when its device memory peaks above max_peak, leaks per step, or syncs more often "
        "per step than allowed (vramscope)",
    )


def _limits(item: Any) -> Optional[Dict[str, Any]]:
    marker = item.get_closest_marker("vramscope")
    if marker is None and not item.config.getoption("--vramscope"):
        return None
    limits: Dict[str, Any] = {"no_leaks": bool(item.config.getoption("--vramscope"))}
    if marker is not None:
        if marker.args:
            raise pytest.UsageError("@pytest.mark.vramscope takes keyword arguments only")
        unknown = set(marker.kwargs) - set(_LIMITS)
        if unknown:
            raise pytest.UsageError(
                f"@pytest.mark.vramscope: unknown argument(s) {sorted(unknown)}; "
                f"expected {', '.join(_LIMITS)}")
        limits.update(marker.kwargs)
    return limits


def _new_sim(config: Any) -> vramscope.SimAllocator:
    return vramscope.SimAllocator(config.getoption("--vramscope-capacity"))


@pytest.fixture
def vramscope_allocator(request: Any) -> Any:
    """A :class:`vramscope.SimAllocator`, active for the test (module-level
    ``vramscope.mark_step()``, ``scope()`` and the marker's checks act on it)."""
    alloc = _new_sim(request.config)
    previous = vramscope.activate(alloc)
    yield alloc
    vramscope.activate(previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: Any) -> Any:
    limits = _limits(item)
    if limits is None:
        return (yield)
    own = None
    if vramscope.active() is None:
        own = _new_sim(item.config)
        vramscope.activate(own)
    target = vramscope.active()
    arm = getattr(target, "arm", None)
    if arm is not None:
        # Keep the state at each step mark: a test's list of kept tensors dies with its
        # locals before the check runs.
        arm(True)
    try:
        result = yield
        failures = target.check(**limits)
    finally:
        if arm is not None:
            arm(False)
        if own is not None:
            vramscope.activate(None)
    if failures:
        pytest.fail("vramscope: this test's device memory broke its limits\n"
                    + "\n\n".join(failures), pytrace=False)
    return result
