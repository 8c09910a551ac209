"""Prometheus ``/metrics`` for ``vramscope.use_allocator()`` (issue 34): the C library's own
metrics server (``vramscope-ffi``, linked into the native module) answers over HTTP with the
figures of the allocator PyTorch allocates through, asked for with ``metrics=`` or with
``VRAMSCOPE_METRICS``, and the text passes Prometheus's own linter (``promtool check
metrics``, from Debian's ``prometheus`` package; skipped with one printed line where promtool
is absent, unless ``VRAMSCOPE_REQUIRE_PROMTOOL=1``).

torch is the stand-in of ``stand_in/``, with ``CUDAPluggableAllocator`` done as PyTorch does
it: the module's file opened by path and its ``vramscope_malloc``/``vramscope_free`` looked up
by name, so the test also proves that the module exports the C library's symbols.
"""

import json
import os
import shutil
import subprocess

import pytest

from test_torch_stand_in import run_with_stand_in

USE_ALLOCATOR_METRICS = '''
    import ctypes, json, sys, urllib.request
    import torch
    import vramscope
    from vramscope import _native


    class CUDAPluggableAllocator:
        """As torch's: the library at `path`, its two functions looked up by name."""

        def __init__(self, path, alloc_fn_name, free_fn_name):
            lib = ctypes.CDLL(path)
            self.malloc = getattr(lib, alloc_fn_name)
            self.malloc.restype = ctypes.c_void_p
            self.malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            self.free = getattr(lib, free_fn_name)
            self.free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                  ctypes.c_void_p]


    current = {}
    torch.cuda.memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    torch.cuda.memory.change_current_allocator = lambda a: current.update(allocator=a)

    refused = None
    try:
        vramscope.use_allocator(metrics="0.0.0.0:0", catch_syncs=False)
    except ValueError as e:
        refused = str(e)
    session = vramscope.use_allocator(metrics=sys.argv[1] or None, catch_syncs=False)
    addr = session.metrics.addr
    url = session.metrics.url

    def scrape():
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.headers["Content-Type"], answer.read().decode()

    _, before = scrape()
    alloc = current["allocator"]
    kept = [alloc.malloc(100 << 20, 0, None), alloc.malloc(4096, 0, None)]
    alloc.free(alloc.malloc(8 << 20, 0, None), 8 << 20, 0, None)
    session.mark_step()
    content_type, body = scrape()
    print(json.dumps({"refused": refused, "addr": addr, "before": before, "body": body,
                      "content_type": content_type, "stats": session.stats(),
                      "devices": _native.devices_served(), "errors": _native.errors()[0]}))
'''

# The statistics of ``memory_stats()`` and the names of their series on ``/metrics``: the
# first part and the unit (``vramscope_{base}_{unit}`` now per pool, ``…_peak_{unit}`` for the
# peak of both pools, ``…_added_{unit}_total`` and ``…_removed_{unit}_total`` per pool).
FAMILIES = {
    "allocated_bytes": ("allocated", "bytes"),
    "reserved_bytes": ("reserved", "bytes"),
    "active_bytes": ("active", "bytes"),
    "inactive_split_bytes": ("inactive_split", "bytes"),
    "requested_bytes": ("requested", "bytes"),
    "allocation": ("allocated", "blocks"),
    "active": ("active", "blocks"),
    "segment": ("reserved", "segments"),
    "inactive_split": ("inactive_split", "blocks"),
}
POOLS = {"large_pool": "large", "small_pool": "small"}
COUNTERS = {
    "vramscope_alloc_retries_total": "num_alloc_retries",
    "vramscope_ooms_total": "num_ooms",
    "vramscope_device_allocs_total": "num_device_alloc",
    "vramscope_device_frees_total": "num_device_free",
}


def series(text):
    """The samples of a Prometheus text page: ``{"name{labels}": value}``."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def check_with_promtool(text, capsys):
    """Prometheus's own linter on ``text``; one printed line where promtool is absent."""
    if shutil.which("promtool") is None:
        assert os.environ.get("VRAMSCOPE_REQUIRE_PROMTOOL") != "1", \
            "promtool not found and VRAMSCOPE_REQUIRE_PROMTOOL=1 (apt-get install prometheus)"
        with capsys.disabled():
            print("\nskipped: promtool not found: the metrics were not checked by "
                  "Prometheus's linter (apt-get install prometheus)")
        return
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"promtool check metrics failed:\n{out.stdout}{out.stderr}"


def serve_and_scrape(tmp_path, metrics_arg, env=None):
    _, out = run_with_stand_in(tmp_path, USE_ALLOCATOR_METRICS, metrics_arg, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def check_figures(result):
    """Every figure of device 0 on the page equals the allocator's own ``memory_stats()``."""
    samples, stats = series(result["body"]), result["stats"]
    assert result["content_type"].startswith("text/plain; version=0.0.4")
    for figure, (base, unit) in FAMILIES.items():
        for field, pool in POOLS.items():
            for name, stat in ((f"vramscope_{base}_{unit}", "current"),
                               (f"vramscope_{base}_added_{unit}_total", "allocated"),
                               (f"vramscope_{base}_removed_{unit}_total", "freed")):
                series_name = f'{name}{{device="0",pool="{pool}"}}'
                assert samples.get(series_name) == stats[figure][field][stat], series_name
        peak = f'vramscope_{base}_peak_{unit}{{device="0"}}'
        assert samples.get(peak) == stats[figure]["all"]["peak"], peak
    for counter, figure in COUNTERS.items():
        assert samples.get(f'{counter}{{device="0"}}') == stats[figure], counter
    assert pools_sum(samples, "vramscope_allocated_bytes") == (100 << 20) + 4096
    assert pools_sum(samples, "vramscope_allocated_added_blocks_total") == 3


def pools_sum(samples, name):
    """The sum of ``name`` on device 0 over its pools: PyTorch's ``all``."""
    return sum(samples[f'{name}{{device="0",pool="{pool}"}}'] for pool in POOLS.values())


def test_use_allocator_serves_metrics_where_asked(tmp_path, capsys):
    result, stderr = serve_and_scrape(tmp_path, "127.0.0.1:0")
    assert result["errors"] == 0, stderr
    assert result["refused"] and "loopback" in result["refused"]
    host, port = result["addr"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert f"serving metrics on http://{result['addr']}/metrics" in stderr
    # Served from use_allocator() on, before the first allocation opens a device: the
    # families are there, with no device's samples yet.
    assert "# TYPE vramscope_allocated_bytes gauge" in result["before"]
    assert not [name for name in series(result["before"]) if 'device="' in name]
    assert result["devices"] == [0]
    check_figures(result)
    check_with_promtool(result["body"], capsys)


def test_use_allocator_serves_metrics_from_the_environment(tmp_path, capsys):
    result, stderr = serve_and_scrape(tmp_path, "", env={"VRAMSCOPE_METRICS": "127.0.0.1:0"})
    assert result["errors"] == 0, stderr
    assert result["addr"].startswith("127.0.0.1:") and not result["addr"].endswith(":0")
    check_figures(result)
    check_with_promtool(result["body"], capsys)


def test_the_module_exports_the_c_library_symbols():
    # PyTorch finds the allocator's functions in the module's file by name.
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found")
    import vramscope
    out = subprocess.run([nm, "-D", "--defined-only", vramscope.native_library_path()],
                         capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    for symbol in ("vramscope_malloc", "vramscope_free", "vramscope_empty_cache",
                   "vramscope_stats_json", "vramscope_metrics_addr", "vramscope_push_scope"):
        assert symbol in exported, symbol
