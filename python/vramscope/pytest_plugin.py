"""pytest plugin (entry point ``pytest11``): device-memory checks on tests.

* ``@pytest.mark.vramscope(max_peak="2 GiB", no_leaks=True, max_syncs_per_step=0)`` checks
  one test; ``pytest --vramscope`` checks every test for leaks (``no_leaks=True``), and a
  marker's own limits win.
* The checks run on what is active during the test: a ``use_allocator()`` or ``attach()``
  session (a GPU run), or else a :class:`vramscope.SimAllocator` the plugin activates for the
  test (the ``vramscope_allocator`` fixture hands it to the test; without a GPU, this is
  where the test's allocations go).
* ``no_leaks`` means what a test asks: in a test that marks steps (``vramscope.mark_step()``),
  no call site keeps memory every step (the ``retained_per_step`` finding); in a unit test
  that marks none, nothing the test allocated is still live once it has returned, its
  fixtures have been torn down and ``gc.collect()`` has run (memray's ``limit_leaks``). That
  check runs after teardown, so a leak there is reported as an error at teardown.
* A test that breaks a limit fails with the finding's text: the Python ``file:line``, the bytes
  per step, the fix.
* ``--vramscope-sarif=PATH`` writes every failure as a SARIF 2.1.0 result at its line, for code
  scanning (the same log ``vramscope report --format sarif`` writes).
"""

from __future__ import annotations

import gc
from typing import Any, Dict, List, Optional

import pytest

import vramscope

_LIMITS = ("max_peak", "no_leaks", "max_syncs_per_step")
# What the call phase leaves for the teardown phase: (target, limits, since, own allocator).
_DEFERRED = pytest.StashKey[Any]()
# The words that start the unit-test leak check's failure (inspector's checks.rs).
_NOTHING_KEPT = "nothing kept ("


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("vramscope", "GPU memory checks (vramscope)")
    group.addoption("--vramscope", action="store_true", default=False,
                    help="check every test for device-memory leaks (retained_per_step)")
    group.addoption("--vramscope-capacity", default="80 GiB",
                    help="capacity of the simulated device tests get (default: 80 GiB)")
    group.addoption("--vramscope-sarif", default=None, metavar="PATH",
                    help="write the tests' vramscope failures as a SARIF 2.1.0 log to PATH")


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


def _fail(item: Any, failures: List[str]) -> None:
    _record_for_sarif(item, failures)
    pytest.fail("vramscope: this test's device memory broke its limits\n"
                + "\n\n".join(failures), pytrace=False)


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
    deferred = False
    try:
        # What the allocator recorded before the test is not the test's (a face without a
        # sequence number, attach(), keeps the per-step rule alone).
        next_seq = getattr(target, "next_event_seq", None)
        since = next_seq() if next_seq is not None else None
        if arm is not None:
            # Keep the state at each step mark: a test's list of kept tensors dies with its
            # locals before the check runs.
            arm(True)
        result = yield
        gc.collect()
        failures = target.check(**limits, **({} if since is None else {"since": since}))
        # A unit test's leak is judged after its fixtures are torn down (below).
        kept = [f for f in failures if _NOTHING_KEPT in f]
        if kept:
            failures = [f for f in failures if f not in kept]
            item.stash[_DEFERRED] = (target, since, own)
            deferred = True
    finally:
        if arm is not None:
            arm(False)
        if own is not None and not deferred:
            vramscope.activate(None)
    if failures:
        _fail(item, failures)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> Any:
    # Taken now: the call phase, which left it, is over.
    pending = item.stash.get(_DEFERRED, None)
    if pending is None:
        return (yield)
    del item.stash[_DEFERRED]
    target, since, own = pending
    try:
        # A fixture's teardown that fails is the test's error, and nothing is judged; the
        # plugin's own allocator goes either way, so that the next test does not inherit it.
        result = yield
        gc.collect()
        failures = [f for f in target.check(no_leaks=True, since=since) if _NOTHING_KEPT in f]
    finally:
        if own is not None and vramscope.active() is own:
            vramscope.activate(None)
    if failures:
        _fail(item, failures)
    return result

# --vramscope-sarif: the failures of the session as SARIF results.
_SARIF_RESULTS = pytest.StashKey[List[Dict[str, Any]]]()


def _record_for_sarif(item: Any, failures: List[str]) -> None:
    results = item.config.stash.get(_SARIF_RESULTS, None)
    if results is None:
        return
    for failure in failures:
        results.append(_sarif_result(item, failure))


def _sarif_result(item: Any, failure: str) -> Dict[str, Any]:
    """One failure as a SARIF result: at the first ``file:line`` it names that exists, else at
    the test's own line."""
    import os
    import re

    named = re.match(r"\w+", failure)
    rule = named.group(0) if named else "vramscope"
    path, line = None, None
    for match in re.finditer(r"((?:[A-Za-z]:)?[^\s:()]+\.py):(\d+)", failure):
        if os.path.isfile(match.group(1)):
            path, line = match.group(1), int(match.group(2))
            break
    if path is None:
        path = str(item.path)
        line = (item.location[1] or 0) + 1
    root = str(item.config.rootpath)
    uri = os.path.relpath(path, root) if os.path.abspath(path).startswith(root + os.sep) else path
    uri = uri.replace(os.sep, "/")
    if os.path.isabs(uri):
        uri = "file://" + uri
    return {
        "ruleId": rule,
        "level": "error",
        "message": {"text": f"{item.nodeid}: {failure}"},
        "locations": [{
            "physicalLocation": {
                "artifactLocation": {"uri": uri} if uri.startswith("file://")
                else {"uri": uri, "uriBaseId": "SRCROOT"},
                "region": {"startLine": max(1, line)},
            }
        }],
        "properties": {"test": item.nodeid},
    }


def pytest_sessionstart(session: Any) -> None:
    if session.config.getoption("--vramscope-sarif"):
        session.config.stash[_SARIF_RESULTS] = []


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    import json
    import pathlib

    config = session.config
    path = config.getoption("--vramscope-sarif")
    results = config.stash.get(_SARIF_RESULTS, None)
    if not path or results is None:
        return
    rules = sorted({r["ruleId"] for r in results})
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "vramscope",
                "version": vramscope.__version__,
                "informationUri": "https://github.com/vramscope/vramscope",
                "rules": [{"id": r, "shortDescription": {"text": f"vramscope pytest limit {r}"}}
                          for r in rules],
            }},
            "originalUriBaseIds": {
                "SRCROOT": {"uri": pathlib.Path(str(config.rootpath)).as_uri() + "/"}},
            "results": results,
        }],
    }
    pathlib.Path(path).write_text(json.dumps(log, indent=2) + "\n")
