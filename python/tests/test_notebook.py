"""``vramscope.load()`` in a notebook, for real: a notebook that loads a snapshot is run
headless by nbclient on an ipykernel kernel, its output is put in a page the way Jupyter puts
outputs (inside a div of the notebook's page), and headless Chromium must show the explorer
drawn there. Beside it, the figures of ``load()`` must be those of ``vramscope report``.

Where nbclient, ipykernel, nbformat or Chromium are missing, the notebook test says so in one
``skipped:`` line and is skipped, unless ``VRAMSCOPE_REQUIRE_NOTEBOOK=1`` (CI), where that is a
failure. Its pages are kept under ``VRAMSCOPE_NOTEBOOK_ARTEFACTS`` when that is set.
"""

import html
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import vramscope
from conftest import line_of, names_site

HERE = os.path.abspath(__file__)
ROOT = pathlib.Path(HERE).resolve().parents[2]
#: A PyTorch snapshot pickle recorded on an H200, with PyTorch's own figures beside it.
TORCH_PICKLE = ROOT / "testkit" / "data" / "torch_h200" / "default.pickle.gz"
TORCH_EXPECTED = TORCH_PICKLE.parent / "expected.json"
BROWSERS = ["/usr/bin/chromium", "/usr/bin/chromium-headless-shell", "/usr/bin/chromium-browser"]
REQUIRED = os.environ.get("VRAMSCOPE_REQUIRE_NOTEBOOK") == "1"


def say(request, line):
    """Prints ``line`` on the terminal, past pytest's capture of the test's output."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{line}")


def not_here(request, why):
    """Skips the test with one printed line, or fails it where CI requires it to run."""
    if REQUIRED:
        pytest.fail(f"VRAMSCOPE_REQUIRE_NOTEBOOK=1, but {why}")
    say(request, f"skipped: {why}")
    pytest.skip(why)


def leaky_run(path):
    """A training loop on the simulated device that keeps one block a step; its snapshot is
    written to ``path``."""
    alloc = vramscope.SimAllocator("4 GiB")
    weights = alloc.alloc(64 << 20, tag="weights")
    kept = []
    for _ in range(12):
        alloc.mark_step()
        activations = [alloc.alloc(8 << 20) for _ in range(4)]
        kept.append(alloc.alloc(1 << 20))  # NOTEBOOK-LEAK
        del activations
    alloc.snapshot(str(path))
    return alloc, weights, kept


def command_line():
    """The ``vramscope`` command next to this Python, or on the PATH; None without one."""
    for found in (shutil.which("vramscope", path=os.path.dirname(sys.executable)),
                  shutil.which("vramscope")):
        if found:
            return found
    return None


def test_load_has_the_figures_of_the_command_line(tmp_path, request):
    path = tmp_path / "run.json"
    leaky_run(path)
    r = vramscope.load(path)
    assert isinstance(r, vramscope.Report)
    assert r.source == "vramscope" and r.input == str(path)
    assert r.steps == 12
    # The peak: the weights, four activations and the kept blocks of every step so far.
    assert r.peak_allocated == (64 << 20) + 4 * (8 << 20) + 12 * (1 << 20)
    assert r.allocated == (64 << 20) + 12 * (1 << 20)
    assert r.stats["peak_allocated_bytes"] == r.peak_allocated
    assert r.reserved is not None and r.reserved >= r.allocated

    # The text report the native module prints states the same figures, and is the summary
    # but for the headline, which names the file.
    text = vramscope._native.file_report_text(str(path))
    fb = vramscope.format_bytes
    s = r.stats
    line = (f"peak allocated {fb(r.peak_allocated)} (after event "
            f"{s['peak_allocated_event']}), peak reserved {fb(r.peak_reserved)}; at the end "
            f"{r.live_blocks} live blocks, {fb(r.allocated)} allocated, "
            f"{fb(r.reserved)} reserved")
    assert line in text, text
    assert f"{r.events} events, {r.steps} steps, {s['allocations']} allocations" in text
    assert r.summary().splitlines()[2:] == text.splitlines()[2:]
    assert str(path) in r.summary().splitlines()[1]

    cli = command_line()
    out = None
    if cli is not None:
        out = subprocess.run([cli, "report", str(path), "--format", "json"],
                             capture_output=True, text=True)
    if out is None or out.returncode != 0:
        say(request, "skipped: no vramscope command line: load() was checked against the "
            "text report only")
        return
    theirs = json.loads(out.stdout)
    ours = r.to_dict()
    # The same keys in the same order as the command line writes them.
    assert list(ours) == list(theirs)
    assert list(ours["devices"][0]) == list(theirs["devices"][0])
    for key in ("format_version", "source", "input", "verdict", "worst_device"):
        assert ours[key] == theirs[key], key
    assert theirs["verdict"] == r.verdict
    assert len(theirs["devices"]) == len(ours["devices"]) == 1
    for key in ("verdict", "device", "steps", "step_source", "stats", "top_sites"):
        assert ours["devices"][0][key] == theirs["devices"][0][key], key
    theirs = theirs["devices"][0]
    assert [(f["kind"], f["site"], f["bytes"]) for f in theirs["findings"]] == [
        (f.kind, f.site, f.bytes) for f in r.findings]
    assert theirs["stats"]["peak_allocated_bytes"] == r.peak_allocated
    assert theirs["stats"]["reserved_bytes"] == r.reserved


def test_the_findings_and_top_sites_name_the_python_line(tmp_path):
    path = tmp_path / "run.json"
    leaky_run(path)
    r = vramscope.load(str(path))
    leak_line = f"{HERE}:{line_of(HERE, '# NOTEBOOK-LEAK')}"
    retained = [f for f in r.findings if f.kind == "retained_per_step"]
    assert [f.site for f in retained] == [leak_line]
    assert isinstance(retained[0], vramscope.Finding)
    assert retained[0].function == "leaky_run"
    assert retained[0].bytes_per_step == pytest.approx(1 << 20)
    assert "retained_per_step" in r.summary()
    assert names_site(r.summary(), HERE, line_of(HERE, "# NOTEBOOK-LEAK")), r.summary()

    end = r.top_sites(at="end")
    assert all(isinstance(t, vramscope.TopSite) for t in end)
    by_site = {t.site: t for t in end}
    assert by_site[leak_line].bytes == 12 << 20 and by_site[leak_line].blocks == 12
    assert (by_site[leak_line].file, by_site[leak_line].line) == (
        HERE, line_of(HERE, "# NOTEBOOK-LEAK"))
    assert sum(t.bytes for t in r.top_sites(at="end", n=1000)) == r.allocated
    peak = r.top_sites(at="peak", n=1000)
    assert sum(t.bytes for t in peak) == r.peak_allocated
    assert [t.bytes for t in peak] == sorted((t.bytes for t in peak), reverse=True)
    assert len(r.top_sites(at="peak", n=1)) == 1
    with pytest.raises(ValueError, match="end"):
        r.top_sites(at="middle")


def test_a_sim_allocator_inspects_itself_as_load_reads_its_snapshot(tmp_path):
    path = tmp_path / "run.json"
    alloc, weights, kept = leaky_run(path)
    mine = alloc.inspect()
    theirs = vramscope.load(path)
    # Taking a snapshot records it as an event: the file's is one event before this one.
    assert mine.events == theirs.events + 1
    assert {**mine.stats, "events": 0} == {**theirs.stats, "events": 0}
    assert [f.text for f in mine.findings] == [f.text for f in theirs.findings]
    assert mine.findings == alloc.report()
    assert mine.input is None and "<vramscope.Report" in repr(mine)


def test_a_file_of_two_devices_is_read_device_by_device(tmp_path):
    # The run's snapshot, with a copy of its events and segments on device 1 (far away).
    path = tmp_path / "run.json"
    leaky_run(path)
    snap = json.loads(path.read_text())
    far = 1 << 40
    copied = []
    for event in snap["events"]:
        event = dict(event, device=1, seq=event["seq"] + len(snap["events"]))
        if event.get("addr"):
            event["addr"] += far
        copied.append(event)
    snap["events"] += copied
    for segment in list(snap["segments"]):
        segment = json.loads(json.dumps(segment))
        segment["device"] = 1
        segment["address"] += far
        for block in segment["blocks"]:
            block["address"] += far
        snap["segments"].append(segment)
    two = tmp_path / "two.json"
    two.write_text(json.dumps(snap))
    both = vramscope.load(two)
    assert len(both.devices) == 2
    assert both.to_dict()["verdict"] == both.verdict
    assert len(both.to_dict()["devices"]) == 2
    assert len({f.device for f in both.findings}) == 2
    assert "<iframe" in both.html() and both.verdict in both.summary()
    with pytest.raises(ValueError, match="no data for device 3"):
        vramscope.load(two, device=3)
    one = vramscope.load(path)
    for device in (0, 1):
        r = vramscope.load(two, device=device)
        assert (r.peak_allocated, r.allocated, r.steps) == (
            one.peak_allocated, one.allocated, one.steps)
        assert [f.site for f in r.findings] == [f.site for f in one.findings]


def test_a_pytorch_snapshot_has_pytorchs_own_peaks():
    if not TORCH_PICKLE.is_file():
        pytest.skip(f"{TORCH_PICKLE} is absent")
    expected = json.loads(TORCH_EXPECTED.read_text())["default"]
    r = vramscope.load(TORCH_PICKLE)
    assert r.source == "pytorch"
    assert r.peak_allocated == expected["max_memory_allocated"]
    assert r.peak_reserved == expected["max_memory_reserved"]
    assert r.capacity is None and r.stats["syncs"] is None  # not recorded: None, never 0
    assert sum(t.bytes for t in r.top_sites(at="peak", n=100_000)) == r.peak_allocated


CATEGORIES = ["activations", "parameters", "optimizer_state", "gradients", "temporaries",
              "inputs", "before_trace", "unknown"]


def test_the_report_says_what_the_memory_is_made_of(tmp_path):
    """``Report.memory_by_category``: at the peak and at the end every category is named and
    they add up to the allocated bytes there; the series adds up to the same at the end, and
    the text report says the same in its lines ``at the peak ...`` and ``at the end ...``."""
    if not TORCH_PICKLE.is_file():
        pytest.skip(f"{TORCH_PICKLE} is absent")
    r = vramscope.load(TORCH_PICKLE)
    by = r.memory_by_category
    # In the legend's order, as the JSON report writes them.
    assert list(by["peak"]) == CATEGORIES == list(by["end"])
    assert sum(by["peak"].values()) == r.peak_allocated
    assert sum(by["end"].values()) == r.allocated
    series = by["series"]
    assert list(series) == ["event"] + CATEGORIES
    assert all(len(series[c]) == len(series["event"]) for c in CATEGORIES)
    assert series["event"] == sorted(series["event"])
    totals = [sum(series[c][i] for c in CATEGORIES) for i in range(len(series["event"]))]
    assert max(totals) == r.peak_allocated
    assert r.to_dict()["devices"][0]["memory_by_category"] == by
    assert list(r.to_dict()["devices"][0]["memory_by_category"]["peak"]) == CATEGORIES
    fb = vramscope.format_bytes
    lines = [line.strip() for line in r.summary().splitlines()]
    # The text says it when the trace tells what some of the memory is; memory that is all
    # unknown gets no line (it would say nothing), and the figures above keep it.
    known = any(by[m][c] for m in ("peak", "end") for c in CATEGORIES if c != "unknown")
    said = [line for line in lines if line.startswith(("at the peak ", "at the end "))]
    if not known:
        assert not said, lines
    else:
        assert any(line.startswith(f"at the peak {fb(r.peak_allocated)}") for line in lines), lines
        if r.allocated:
            assert any(line.startswith(f"at the end {fb(r.allocated)}") for line in lines), lines


def test_the_html_output_is_the_page_in_a_frame(tmp_path):
    path = tmp_path / "run.json"
    leaky_run(path)
    r = vramscope.load(path)
    page = r.html()
    assert page.startswith("<!DOCTYPE html>") and 'id="chart"' in page
    frame = r._repr_html_()
    # Sandboxed: scripts run, but the page has no origin of its own (issue 44).
    assert frame.startswith(
        '<div class="vramscope-report"><iframe sandbox="allow-scripts" srcdoc="')
    assert "allow-same-origin" not in frame.split("srcdoc=", 1)[0]
    # The page is inside the attribute, escaped: no element of it reaches the notebook.
    srcdoc = frame.split('srcdoc="', 1)[1].split('"', 1)[0]
    # The page's links to its findings stay in the frame's page (a srcdoc page resolves them
    # against the notebook's address otherwise).
    framed = page.replace("<head>", '<head><base href="about:srcdoc">', 1)
    assert framed != page, "the page has a <head> for the <base>"
    assert "<" not in srcdoc and html.unescape(srcdoc) == framed
    assert "http://" not in page and "https://" not in page
    assert 'height:500px' in r.html_frame(height=500)


# The page a notebook front end shows: the output goes into an output area's div through
# innerHTML, as JupyterLab and VS Code put text/html outputs. The probe then reads, from each
# frame, what the explorer drew.
HOST = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>notebook</title>
<style>body{margin:0;font:13px sans-serif} .jp-Cell{width:1000px;margin:8px}</style></head>
<body><div id="notebook"></div><pre id="probe"></pre>
<script>
const outputs = %s;
const notebook = document.getElementById("notebook");
for (const output of outputs) {
  const cell = document.createElement("div");
  cell.className = "jp-Cell";
  cell.innerHTML = '<div class="jp-OutputArea"><div class="jp-OutputArea-output ' +
    'jp-RenderedHTMLCommon" data-mime-type="text/html"></div></div>';
  cell.querySelector("[data-mime-type]").innerHTML = output;
  notebook.appendChild(cell);
}
const seen = [];
function probe(frame) {
  const doc = frame.contentDocument;
  const canvas = doc.getElementById("chart");
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  const colours = new Set();
  for (let i = 0; i < pixels.length; i += 4) {
    const [r, g, b, a] = [pixels[i], pixels[i + 1], pixels[i + 2], pixels[i + 3]];
    if (a > 0 && (r < 235 || g < 235 || b < 235)) {
      inked++;
      colours.add((r << 16) | (g << 8) | b);
    }
  }
  // A problem's "details" link moves within the frame's own page, which stays the frame's.
  const link = doc.querySelector('#problems a[href^="#finding-"]');
  const before = frame.contentWindow.scrollY;
  if (link) link.click();
  return {
    link: link ? frame.contentWindow.location.href : null,
    scrolled: frame.contentWindow.scrollY - before,
    ready: doc.body.dataset.ready || "",
    errors: Array.from(doc.getElementById("errors").children).map((li) => li.textContent),
    bands: Number(doc.getElementById("band-count").dataset.count),
    peak: doc.getElementById("peak-figure").dataset.bytes,
    width: canvas.width, height: canvas.height, inked: inked, colours: colours.size,
    frameHeight: frame.getBoundingClientRect().height,
  };
}
const frames = Array.from(document.querySelectorAll("#notebook iframe"));
let pending = frames.length;
function record() {
  document.getElementById("probe").textContent = JSON.stringify({
    frames: seen,
    hostChart: document.getElementById("chart") !== null,
  });
}
frames.forEach((frame, i) => frame.addEventListener("load", () => {
  try { seen[i] = probe(frame); } catch (e) { seen[i] = { failure: String(e) }; }
  pending -= 1;
  if (pending === 0) record();
}));
record();
</script></body></html>
"""


def browser():
    return next((b for b in BROWSERS if os.path.isfile(b)), None)


def run_notebook(request, cells, cwd):
    """Runs a notebook of ``cells`` (code) on an ipykernel kernel; returns its cells."""
    try:
        import nbformat
        from nbclient import NotebookClient
        import ipykernel  # noqa: F401  (the kernel the notebook runs on)
    except ImportError as e:
        not_here(request, f"{e.name} is not installed: the notebook test did not run "
                 "(pip install nbclient nbformat ipykernel)")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return notebook.cells


def test_a_notebook_shows_the_explorer_drawn(tmp_path, request):
    path = tmp_path / "run.json"
    leaky_run(path)
    second = TORCH_PICKLE if TORCH_PICKLE.is_file() else path
    chrome = browser()
    if chrome is None:
        not_here(request, "chromium is not installed: the notebook test did not run")
    cells = run_notebook(request, [
        f"import vramscope\nr = vramscope.load({str(path)!r})\nr",
        f"vramscope.load({str(second)!r})",
    ], tmp_path)
    outputs = []
    for cell in cells:
        results = [o for o in cell.outputs if o.output_type == "execute_result"]
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, "\n".join(errors[0].traceback)
        assert len(results) == 1, cell.outputs
        data = results[0].data
        assert data["text/plain"].startswith("<vramscope.Report")
        html_output = data["text/html"]
        # The frame is sandboxed, scripts allowed and no origin of its own, so its document
        # is closed to the notebook (issue 44). The probe below reads what the explorer drew
        # through that document, so the host page opens it to the same origin; the page runs
        # the same scripts either way.
        assert '<iframe sandbox="allow-scripts" srcdoc=' in html_output
        outputs.append(html_output.replace(
            'sandbox="allow-scripts"', 'sandbox="allow-scripts allow-same-origin"', 1))
    expected = [vramscope.load(path), vramscope.load(second)]

    out_dir = pathlib.Path(os.environ.get("VRAMSCOPE_NOTEBOOK_ARTEFACTS") or tmp_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / "notebook.html"
    # `</` is written `<\/` so that no output can end the host page's script.
    page.write_text(HOST % json.dumps(outputs).replace("</", "<\\/"))
    profile = tmp_path / "profile"
    args = [chrome, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
            "--window-size=1100,1900", "--virtual-time-budget=10000"]
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=180).stdout
    probe = dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
    seen = json.loads(html.unescape(probe))
    assert not seen["hostChart"], "the explorer's ids stay inside its frame"
    assert len(seen["frames"]) == 2, seen
    for frame, report in zip(seen["frames"], expected):
        assert "failure" not in frame, frame
        assert frame["errors"] == [], frame
        assert frame["ready"] == "1", frame
        assert frame["peak"] == str(report.peak_allocated), frame
        assert frame["bands"] >= 1, frame
        # Drawn: a good part of the chart is ink, in at least as many colours as bands.
        assert frame["width"] > 300 and frame["height"] > 100, frame
        assert frame["inked"] > frame["width"] * frame["height"] // 20, frame
        assert frame["colours"] >= frame["bands"], frame
        assert frame["frameHeight"] >= 400, frame
    # The run on the simulated device has its weights, activations and kept blocks apart,
    # and an error whose link scrolls its frame to the finding.
    first = seen["frames"][0]
    assert first["bands"] >= 3, first
    assert first["link"] == "about:srcdoc#finding-0" and first["scrolled"] > 0, first
    shot = out_dir / "notebook.png"
    subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=180)
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
