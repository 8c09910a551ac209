"""``SimAllocator(metrics=...)`` scraped by a real Prometheus server (Debian's ``prometheus``
package, which ``.ci/run`` installs) every second (issue 49): every series arrives with the
type it is served with, ``up`` is 1, the capacity is the simulated device's, a counter's
``rate()`` moves, and after the script ends its last figures are still served and scraped
for ``VRAMSCOPE_METRICS_LINGER``. The last figures also reach a real Pushgateway
(``prometheus-pushgateway``) with ``VRAMSCOPE_METRICS_PUSH``. Where a binary is absent the test
says so in one line and passes, unless ``VRAMSCOPE_REQUIRE_PROMETHEUS=1``."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def needs(binary, package, capsys):
    """Whether ``binary`` is here; one printed line where it is not."""
    if shutil.which(binary):
        return True
    assert os.environ.get("VRAMSCOPE_REQUIRE_PROMETHEUS") != "1", \
        f"{binary} not found and VRAMSCOPE_REQUIRE_PROMETHEUS=1 (apt-get install {package})"
    with capsys.disabled():
        print(f"\nskipped: {binary} not found: not checked against a real {binary} "
              f"(apt-get install {package})")
    return False


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read().decode()


def poll(what, timeout, check):
    """``check()`` every 100 ms until it gives something true; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)


class Server:
    """A Debian server binary on a free port, with a folder of its own; stopped on exit."""

    def __init__(self, argv, ready_addr, folder):
        self.folder = folder
        self.log = open(os.path.join(folder, "log"), "w")
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log)
        self.addr = ready_addr

        def ready():
            assert self.process.poll() is None, open(os.path.join(folder, "log")).read()
            return get(f"http://{ready_addr}/-/ready", timeout=2) is not None
        poll(f"{argv[0]} ready", 60, ready)

    def close(self):
        self.process.kill()
        self.process.wait()
        self.log.close()


@pytest.fixture
def prometheus_for(tmp_path):
    started = []

    def start(job, target):
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(textwrap.dedent(f"""\
            global:
              scrape_interval: 1s
              scrape_timeout: 900ms
            scrape_configs:
              - job_name: {job}
                static_configs:
                  - targets: ['{target}']
            """))
        server = Server(["prometheus", f"--config.file={config}",
                         f"--storage.tsdb.path={tmp_path / 'data'}",
                         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                        f"127.0.0.1:{port}", str(tmp_path))
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def query(prometheus, promql):
    """The instant query's result: ``[(labels, value)]``."""
    answer = json.loads(get(f"http://{prometheus.addr}/api/v1/query?"
                            + urllib.parse.urlencode({"query": promql})))
    assert answer["status"] == "success", answer
    return [(r["metric"], float(r["value"][1])) for r in answer["data"]["result"]]


def served_types(text):
    return {line.split()[2]: line.split()[3]
            for line in text.splitlines() if line.startswith("# TYPE ")}


# The program: a simulated device that allocates and frees each step until told to stop
# (a line on standard input), then keeps one more tensor and ends.
PROGRAM = '''
import json, sys, threading, time
import vramscope

alloc = vramscope.SimAllocator("3 GiB", metrics=sys.argv[1])
kept = [alloc.alloc(64 << 20)]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print("serving", alloc.metrics.url, flush=True)
while not stop.is_set():
    alloc.alloc(4 << 20).free()
    alloc.mark_step()
    time.sleep(0.05)
kept.append(alloc.alloc(32 << 20))
stats = alloc.stats()
print(json.dumps({"large": stats["allocated_bytes"]["large_pool"]["current"]}), flush=True)
'''


def test_a_real_prometheus_scrapes_a_sim_allocator_and_its_last_values(
        tmp_path, capsys, prometheus_for):
    if not needs("prometheus", "prometheus", capsys):
        return
    target = f"127.0.0.1:{free_port()}"
    prometheus = prometheus_for("sim", target)
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, VRAMSCOPE_METRICS_LINGER="5s")
    env.pop("VRAMSCOPE_METRICS", None)
    program = subprocess.Popen([sys.executable, str(script), target], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        assert program.stdout.readline().startswith(f"serving http://{target}/metrics")
        poll("a counter's rate", 60, lambda: query(
            prometheus,
            'rate(vramscope_allocated_added_bytes_total{job="sim",pool="large"}[5s]) > 0'))
        assert [v for _, v in query(prometheus, 'up{job="sim"}')] == [1.0]
        assert [v for _, v in query(prometheus,
                                    'vramscope_device_capacity_bytes{job="sim"}')] == [3 << 30]
        served = served_types(get(f"http://{target}/metrics"))
        metadata = json.loads(get(f"http://{prometheus.addr}/api/v1/targets/metadata?"
                                  + urllib.parse.urlencode({"match_target": '{job="sim"}'})))
        seen = {m["metric"]: m["type"] for m in metadata["data"]
                if m["metric"].startswith("vramscope_")}
        assert seen == served
        for name in served:
            assert query(prometheus, f'{name}{{job="sim"}}'), name

        # The script ends; its last figures stay on the endpoint for the linger, and are
        # scraped.
        program.stdin.write("end\n")
        program.stdin.flush()
        last = json.loads(program.stdout.readline())
        ended = time.time()
        poll("a scrape after the end", 5, lambda: query(
            prometheus, f'timestamp(up{{job="sim"}}) > {ended} and up{{job="sim"}} == 1'))
        assert [v for _, v in query(
            prometheus, 'vramscope_allocated_bytes{job="sim",pool="large"}')] == [last["large"]]
        _, stderr = program.communicate(timeout=30)
        assert program.returncode == 0, stderr
        assert "serving the last metrics on" in stderr and "VRAMSCOPE_METRICS_LINGER" in stderr
        assert time.time() - ended >= 4
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


PUSHED = '''
import sys
import vramscope

alloc = vramscope.SimAllocator("1 GiB", metrics="127.0.0.1:0")
kept = alloc.alloc(10 << 20)
'''


def test_the_last_values_of_a_sim_allocator_reach_a_real_pushgateway(tmp_path, capsys):
    if not needs("prometheus-pushgateway", "prometheus-pushgateway", capsys):
        return
    addr = f"127.0.0.1:{free_port()}"
    gateway = Server(["prometheus-pushgateway", f"--web.listen-address={addr}",
                      "--log.level=warn"], addr, str(tmp_path))
    try:
        script = tmp_path / "pushed.py"
        script.write_text(PUSHED)
        env = dict(os.environ, VRAMSCOPE_METRICS_PUSH=f"http://{addr}")
        env.pop("VRAMSCOPE_METRICS", None)
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"pushed the last metrics to http://{addr}/metrics/job/vramscope" in out.stderr
        pushed = get(f"http://{addr}/metrics")
        line = [l for l in pushed.splitlines() if l.startswith(
            'vramscope_allocated_bytes{device="0",instance="",job="vramscope",pool="large"}')]
        assert len(line) == 1 and float(line[0].split()[-1]) == 10 << 20, pushed
    finally:
        gateway.close()


def test_use_allocator_pushes_its_last_values_at_exit(tmp_path, capsys):
    """The C library's server lives in a static that is never dropped: its push runs in an
    ``atexit`` hook of the C library, after the interpreter has finished."""
    if not needs("prometheus-pushgateway", "prometheus-pushgateway", capsys):
        return
    from test_metrics_faces import USE_ALLOCATOR_METRICS
    from test_torch_stand_in import run_with_stand_in
    addr = f"127.0.0.1:{free_port()}"
    gateway = Server(["prometheus-pushgateway", f"--web.listen-address={addr}",
                      "--log.level=warn"], addr, str(tmp_path))
    try:
        _, out = run_with_stand_in(tmp_path, USE_ALLOCATOR_METRICS, "127.0.0.1:0",
                                   env={"VRAMSCOPE_METRICS_PUSH": f"http://{addr}"})
        stats = json.loads(out.stdout.strip().splitlines()[-1])["stats"]
        assert f"pushed the last metrics to http://{addr}/metrics/job/vramscope" in out.stderr
        pushed = get(f"http://{addr}/metrics")
        for pool in ("large", "small"):
            line = [l for l in pushed.splitlines() if l.startswith(
                f'vramscope_allocated_bytes{{device="0",instance="",job="vramscope",'
                f'pool="{pool}"}}')]
            assert len(line) == 1, pushed
            assert float(line[0].split()[-1]) == \
                stats["allocated_bytes"][f"{pool}_pool"]["current"], pushed
    finally:
        gateway.close()
