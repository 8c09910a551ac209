"""Prometheus ``/metrics`` from the two faces that are not the pluggable allocator (issue 34):
``SimAllocator`` (its caching allocator's statistics) and ``attach()`` (PyTorch's own
allocator: ``torch.cuda.memory_stats()`` read at each scrape, under vramscope's metric names).
Each page's figures equal the face's own and pass ``promtool check metrics``."""

import json
import urllib.error
import urllib.request

import pytest

import vramscope
from test_metrics_faces import check_figures, check_with_promtool, series
from test_torch_stand_in import run_with_stand_in


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


def test_a_sim_allocator_serves_its_statistics_where_asked(capsys):
    alloc = vramscope.SimAllocator("1 GiB", metrics="127.0.0.1:0")
    assert alloc.metrics is not None and alloc.metrics.url.startswith("http://127.0.0.1:")
    kept = [alloc.alloc(100 << 20), alloc.alloc(4096)]
    alloc.alloc(8 << 20).free()
    content_type, body = scrape(alloc.metrics.url)
    check_figures({"content_type": content_type, "body": body, "stats": alloc.stats()})
    check_with_promtool(body, capsys)
    url = alloc.metrics.url
    alloc.metrics.close()
    with pytest.raises(urllib.error.URLError):
        scrape(url)
    del kept


def test_a_sim_allocator_refuses_a_non_loopback_address():
    with pytest.raises(ValueError, match="loopback"):
        vramscope.SimAllocator("1 GiB", metrics="0.0.0.0:0")


SIM_FROM_ENV = '''
    import json, urllib.request
    import vramscope

    first = vramscope.SimAllocator("1 GiB")
    second = vramscope.SimAllocator("1 GiB")  # the process's address is taken: not served
    kept = [first.alloc(100 << 20), first.alloc(4096)]
    first.alloc(8 << 20).free()
    with urllib.request.urlopen(first.metrics.url, timeout=10) as answer:
        body = answer.read().decode()
        content_type = answer.headers["Content-Type"]
    print(json.dumps({"body": body, "content_type": content_type, "stats": first.stats(),
                      "second": second.metrics is None}))
'''


def test_vramscope_metrics_serves_the_first_sim_allocator_of_the_process(tmp_path, capsys):
    _, out = run_with_stand_in(tmp_path, SIM_FROM_ENV, env={"VRAMSCOPE_METRICS": "127.0.0.1:0"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["second"]
    check_figures(result)
    check_with_promtool(result["body"], capsys)


ATTACH_METRICS = '''
    import json, sys, urllib.request
    import torch
    import vramscope

    session = vramscope.attach(metrics=sys.argv[1] or None, catch_syncs=False)
    kept = [torch.empty(100 << 20), torch.empty(4096)]
    scratch = torch.empty(8 << 20)
    del scratch
    with urllib.request.urlopen(session.metrics.url, timeout=10) as answer:
        body = answer.read().decode()
    print(json.dumps({"body": body, "stats": torch.cuda.memory_stats(0)}))
'''

# memory_stats()'s flat names and the series that carry them (``{pool}`` where per pool).
POOLS = {"large_pool": "large", "small_pool": "small"}
FAMILIES = {"allocated_bytes": "allocated_bytes", "reserved_bytes": "reserved_bytes",
            "active_bytes": "active_bytes", "allocation": "allocated_blocks",
            "segment": "reserved_segments"}


def series_of(name, pool, stat):
    """The series of ``memory_stats()``'s ``{name}.{pool}.{stat}``, or None where none is."""
    base, unit = FAMILIES[name].rsplit("_", 1)
    if pool == "all":
        return f'vramscope_{base}_peak_{unit}{{device="0"}}' if stat == "peak" else None
    name = {"current": f"vramscope_{base}_{unit}",
            "allocated": f"vramscope_{base}_added_{unit}_total",
            "freed": f"vramscope_{base}_removed_{unit}_total"}.get(stat)
    return name and f'{name}{{device="0",pool="{POOLS[pool]}"}}'


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_attach_serves_pytorchs_own_statistics(tmp_path, capsys, how):
    env = {"VRAMSCOPE_METRICS": "127.0.0.1:0"} if how == "environment" else {}
    arg = "127.0.0.1:0" if how == "argument" else ""
    _, out = run_with_stand_in(tmp_path, ATTACH_METRICS, arg, env=env)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    samples, stats = series(result["body"]), result["stats"]
    compared = 0
    for key, value in stats.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] not in FAMILIES:
            continue
        name, pool, stat = parts
        series_name = series_of(name, pool, stat)
        if series_name is None:
            continue
        assert samples.get(series_name) == value, series_name
        compared += 1
    assert compared >= 30
    assert sum(samples[f'vramscope_allocated_bytes{{device="0",pool="{pool}"}}']
               for pool in POOLS.values()) >= (100 << 20) + 4096
    assert samples['vramscope_ooms_total{device="0"}'] == stats["num_ooms"]
    # The capacity and free bytes are torch.cuda.mem_get_info()'s (the stand-in's 80 GiB).
    assert samples['vramscope_device_capacity_bytes{device="0"}'] == 80 << 30
    assert samples['vramscope_device_free_bytes{device="0"}'] == \
        (80 << 30) - stats["reserved_bytes.all.current"]
    check_with_promtool(result["body"], capsys)
