//! The inspector's results as typed Python objects, built here from the Rust values: a
//! [`Finding`] for each of the detectors' findings, a [`Report`] for the whole of
//! `vramscope report` on one snapshot (its figures, its findings, the text report, the call
//! sites at the end or at the peak as [`TopSite`] rows, and the HTML explorer for a notebook),
//! and plain dictionaries for statistics. Nothing crosses the boundary as JSON text.
//!
//! The rest of the crate reaches these through [`findings_to_py`] (the inspector's findings),
//! [`findings_of`] (the findings of a snapshot), [`Report::from_snapshot`] (a report of a
//! snapshot), [`device_part`] (the one device of a snapshot a report describes) and
//! [`stats_to_py`] (PyTorch's `memory_stats()` figures as a dictionary).
//!
//! In a notebook a [`Report`] shows itself (`_repr_html_`) as the page `vramscope report
//! --format html` writes, inside an `<iframe srcdoc>`: the page is self-contained (no network,
//! no file), its styles, element ids and key bindings stay inside the frame, so they neither
//! restyle the notebook nor collide with a second report's, and the frame needs no script of
//! the notebook's own, which Jupyter and VS Code may not run.

use std::fmt::Write as _;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::Serialize;
use vramscope_analysis::detect::{self, EvidenceValue};
use vramscope_analysis::model_view::ModelView;
use vramscope_analysis::report as inspector_report;
use vramscope_analysis::report::top_sites_and_rest;
use vramscope_analysis::report::{build_report_view, ReportOptions};
use vramscope_engine::devices;
use vramscope_model::{format_bytes, MemoryStats, Snapshot};
use vramscope_render::html;
use vramscope_render::{file_verdict, headline, render_file, render_file_json, Format};

use crate::analysis;

/// The height of the frame a notebook shows a report in, in CSS pixels; the page scrolls
/// inside it.
pub const FRAME_HEIGHT: u32 = 820;

/// The value `value` as a Python object: `None`, a bool, an int, a float, a str, a list or a
/// dict (its keys in the map's own order).
pub fn value_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            (None, None) => n.as_f64().unwrap_or(0.0).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, value_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// The JSON document `json` as Python objects, by Python's own `json.loads`: its objects
/// become dicts with their keys in the document's order (the order `vramscope report
/// --format json` writes, categories as the legend lists them), which a `serde_json::Value`
/// would sort.
fn json_to_py<'py>(py: Python<'py>, json: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (json,))
}

/// `value` (plain data) as a Python object, through [`value_to_py`].
fn data_to_py<'py, T: Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(value)
        .map_err(|e| PyValueError::new_err(format!("could not convert the figures: {e}")))?;
    value_to_py(py, &value)
}

/// PyTorch's `memory_stats()` figures, nested as `MemoryStats` nests them
/// (`stats["allocated_bytes"]["all"]["current"]`), as a dictionary built here.
pub fn stats_to_py<'py>(py: Python<'py>, stats: &MemoryStats) -> PyResult<Bound<'py, PyAny>> {
    data_to_py(py, stats)
}

/// One site inside a finding that gathers several (a graph kept alive by one reference, the
/// holders of one kind of memory).
#[pyclass(
    module = "vramscope._native",
    name = "FindingSite",
    frozen,
    eq,
    get_all
)]
#[derive(Clone, Debug, PartialEq)]
pub struct FindingSite {
    /// The site as a reader names it (`file:line`, `MmBackward0 (backward)`).
    site: String,
    /// The function there (may be empty).
    function: String,
    /// Bytes of the site in the finding.
    bytes: u64,
    /// Blocks of the site in the finding.
    blocks: u64,
}

#[pymethods]
impl FindingSite {
    fn __repr__(&self) -> String {
        format!(
            "FindingSite({:?}, function={:?}, bytes={}, blocks={})",
            self.site, self.function, self.bytes, self.blocks
        )
    }
}

/// One diagnosis of the inspector: what, where, how much, and the fix.
#[pyclass(module = "vramscope._native", name = "Finding", frozen, eq)]
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    kind: String,
    severity: String,
    site: Option<String>,
    function: String,
    bytes: u64,
    count: u64,
    summary: String,
    fix: String,
    bytes_per_step: Option<f64>,
    count_per_step: Option<f64>,
    first_step: Option<u64>,
    last_step: Option<u64>,
    evidence: Vec<(String, EvidenceValue)>,
    made_at: Option<String>,
    frames: Vec<String>,
    sites: Vec<FindingSite>,
    /// The device the finding is on (`cuda:1`), for a finding of a report of a file of several
    /// devices; `None` otherwise.
    device: Option<String>,
}

impl Finding {
    /// The finding with the device it is on.
    pub fn on_device(mut self, device: &str) -> Finding {
        self.device = Some(device.to_string());
        self
    }

    /// The Python finding of the inspector's `finding`.
    pub fn from_inspector(finding: &detect::Finding) -> Finding {
        Finding {
            kind: finding.kind.as_str().to_string(),
            severity: finding.severity.as_str().to_string(),
            site: finding.site.clone(),
            function: finding.function.clone(),
            bytes: finding.bytes,
            count: finding.count,
            summary: finding.summary.clone(),
            fix: finding.fix.clone(),
            bytes_per_step: finding.per_step.map(|p| p.bytes),
            count_per_step: finding.per_step.map(|p| p.count),
            first_step: finding.first_step,
            last_step: finding.last_step,
            evidence: finding.evidence.entries().to_vec(),
            made_at: finding.made_at.clone(),
            frames: finding.frames.clone(),
            sites: finding
                .sites
                .iter()
                .map(|s| FindingSite {
                    site: s.site.clone(),
                    function: s.function.clone(),
                    bytes: s.bytes,
                    blocks: s.blocks,
                })
                .collect(),
            device: None,
        }
    }

    /// The finding as one paragraph: severity, kind, site, what was seen, the fix.
    fn paragraph(&self) -> String {
        let mut place = self.site.clone().unwrap_or_else(|| "(no site)".to_string());
        if !self.function.is_empty() {
            let _ = write!(place, " in {}", self.function);
        }
        if let Some(made_at) = self
            .made_at
            .as_ref()
            .filter(|m| !m.is_empty() && Some(*m) != self.site.as_ref())
        {
            let _ = write!(place, " (made at {made_at})");
        }
        // One line, printed as it is: the file's text in it escaped as the command line
        // escapes it (no control, line break or CI workflow command).
        let line = format!(
            "{} {} at {place}: {} Fix: {}",
            self.severity, self.kind, self.summary, self.fix
        );
        vramscope_model::terminal::sanitize(&line).into_owned()
    }
}

/// An evidence value of a dictionary: an int that fits in 64 bits, a float, or anything
/// else as its text.
fn evidence_value(value: &Bound<'_, PyAny>) -> PyResult<EvidenceValue> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(EvidenceValue::Text(value.str()?.to_string()));
    }
    if let Ok(v) = value.extract::<u64>() {
        return Ok(EvidenceValue::Int(v));
    }
    if value.is_instance_of::<pyo3::types::PyFloat>()
        || value.is_instance_of::<pyo3::types::PyInt>()
    {
        return Ok(EvidenceValue::Float(value.extract::<f64>()?));
    }
    Ok(EvidenceValue::Text(value.str()?.to_string()))
}

/// The pairs of an evidence dictionary, in its order.
fn evidence_pairs(dict: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, EvidenceValue)>> {
    let mut pairs = Vec::new();
    if let Some(dict) = dict {
        for (key, value) in dict.iter() {
            pairs.push((key.str()?.to_string(), evidence_value(&value)?));
        }
    }
    Ok(pairs)
}

/// `dict[key]`, or `None` when the key is absent or its value is `None`.
fn item<'py, T: FromPyObjectOwned<'py>>(
    dict: &Bound<'py, PyDict>,
    key: &str,
) -> PyResult<Option<T>> {
    match dict.get_item(key)? {
        Some(v) if !v.is_none() => Ok(Some(v.extract::<T>().map_err(Into::into)?)),
        _ => Ok(None),
    }
}

#[pymethods]
impl Finding {
    /// A finding made by hand (the inspector makes them in [`Report`]s and `report()`).
    #[new]
    #[pyo3(signature = (kind, severity, site, function, bytes, count, summary, fix,
                        bytes_per_step = None, first_step = None, last_step = None,
                        evidence = None, made_at = None, frames = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: String,
        severity: String,
        site: Option<String>,
        function: String,
        bytes: u64,
        count: u64,
        summary: String,
        fix: String,
        bytes_per_step: Option<f64>,
        first_step: Option<u64>,
        last_step: Option<u64>,
        evidence: Option<&Bound<'_, PyDict>>,
        made_at: Option<String>,
        frames: Option<Vec<String>>,
    ) -> PyResult<Finding> {
        Ok(Finding {
            kind,
            severity,
            site,
            function,
            bytes,
            count,
            summary,
            fix,
            bytes_per_step,
            count_per_step: None,
            first_step,
            last_step,
            evidence: evidence_pairs(evidence)?,
            made_at,
            frames: frames.unwrap_or_default(),
            sites: Vec::new(),
            device: None,
        })
    }

    /// The finding of one entry of a JSON report's `findings` (`vramscope report --format
    /// json`), read with `json.load`.
    #[staticmethod]
    fn from_json(value: &Bound<'_, PyDict>) -> PyResult<Finding> {
        let required = |key: &str| -> PyResult<String> {
            item::<String>(value, key)?
                .ok_or_else(|| PyValueError::new_err(format!("a finding needs {key:?}")))
        };
        let per_step: Option<Bound<'_, PyDict>> = match value.get_item("per_step")? {
            Some(v) if !v.is_none() => Some(v.cast_into::<PyDict>()?),
            _ => None,
        };
        let rate = |key: &str| -> PyResult<Option<f64>> {
            per_step.as_ref().map_or(Ok(None), |p| item::<f64>(p, key))
        };
        let evidence: Option<Bound<'_, PyDict>> = match value.get_item("evidence")? {
            Some(v) if !v.is_none() => Some(v.cast_into::<PyDict>()?),
            _ => None,
        };
        let mut sites = Vec::new();
        if let Some(list) = item::<Vec<Bound<'_, PyDict>>>(value, "sites")? {
            for s in list {
                sites.push(FindingSite {
                    site: item::<String>(&s, "site")?.unwrap_or_default(),
                    function: item::<String>(&s, "function")?.unwrap_or_default(),
                    bytes: item::<u64>(&s, "bytes")?.unwrap_or(0),
                    blocks: item::<u64>(&s, "blocks")?.unwrap_or(0),
                });
            }
        }
        Ok(Finding {
            kind: required("kind")?,
            severity: required("severity")?,
            site: item(value, "site")?,
            function: item(value, "function")?.unwrap_or_default(),
            bytes: item(value, "bytes")?.unwrap_or(0),
            count: item(value, "count")?.unwrap_or(0),
            summary: item(value, "summary")?.unwrap_or_default(),
            fix: item(value, "fix")?.unwrap_or_default(),
            bytes_per_step: rate("bytes")?,
            count_per_step: rate("count")?,
            first_step: item(value, "first_step")?,
            last_step: item(value, "last_step")?,
            evidence: evidence_pairs(evidence.as_ref())?,
            made_at: item(value, "made_at")?,
            frames: item(value, "frames")?.unwrap_or_default(),
            sites,
            device: None,
        })
    }

    /// What the finding is about (`retained_per_step`, `sync_in_loop`, ...).
    #[getter]
    fn kind(&self) -> &str {
        &self.kind
    }

    /// `error`, `warning` or `info`.
    #[getter]
    fn severity(&self) -> &str {
        &self.severity
    }

    /// The call site as `file:line`, or `None`.
    #[getter]
    fn site(&self) -> Option<&str> {
        self.site.as_deref()
    }

    /// The function at the site (may be empty).
    #[getter]
    fn function(&self) -> &str {
        &self.function
    }

    /// The bytes concerned (retained, copied, released, held, requested).
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The events concerned (blocks, copies, calls, OOMs).
    #[getter]
    fn count(&self) -> u64 {
        self.count
    }

    /// One sentence saying what was seen.
    #[getter]
    fn summary(&self) -> &str {
        &self.summary
    }

    /// One line saying what to do.
    #[getter]
    fn fix(&self) -> &str {
        &self.fix
    }

    /// Bytes per step, for per-step findings.
    #[getter]
    fn bytes_per_step(&self) -> Option<f64> {
        self.bytes_per_step
    }

    /// Events per step, for per-step findings.
    #[getter]
    fn count_per_step(&self) -> Option<f64> {
        self.count_per_step
    }

    /// The first step involved.
    #[getter]
    fn first_step(&self) -> Option<u64> {
        self.first_step
    }

    /// The last step involved.
    #[getter]
    fn last_step(&self) -> Option<u64> {
        self.last_step
    }

    /// The numbers behind the finding, in the detector's order (a new dict each time).
    #[getter]
    fn evidence<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, value) in &self.evidence {
            match value {
                EvidenceValue::Int(v) => dict.set_item(key, v)?,
                EvidenceValue::Float(v) => dict.set_item(key, v)?,
                EvidenceValue::Text(v) => dict.set_item(key, v)?,
            }
        }
        Ok(dict)
    }

    /// For kept memory: the line that allocated it (`site` is the line that keeps it).
    #[getter]
    fn made_at(&self) -> Option<&str> {
        self.made_at.as_deref()
    }

    /// The user's frames from `site` in to `made_at`, as `file:line (function)`.
    #[getter]
    fn frames(&self) -> Vec<String> {
        self.frames.clone()
    }

    /// The device the finding is on (`"cuda:1"`), when it comes from a report of a file of
    /// several devices; `None` otherwise.
    #[getter]
    fn device(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// The sites inside the finding, largest first, when it gathers several.
    #[getter]
    fn sites(&self) -> Vec<FindingSite> {
        self.sites.clone()
    }

    /// The finding as one paragraph: severity, kind, site, what was seen, the fix.
    #[getter]
    fn text(&self) -> String {
        self.paragraph()
    }

    fn __str__(&self) -> String {
        self.paragraph()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let r = |v: Bound<'_, PyAny>| -> PyResult<String> { Ok(v.repr()?.to_string()) };
        Ok(format!(
            "Finding(kind={}, severity={}, site={}, function={}, bytes={}, count={}, \
             summary={}, fix={}, bytes_per_step={}, first_step={}, last_step={}, evidence={}, \
             made_at={}, frames={})",
            r(self.kind.clone().into_pyobject(py)?.into_any())?,
            r(self.severity.clone().into_pyobject(py)?.into_any())?,
            r(self.site.clone().into_pyobject(py)?.into_any())?,
            r(self.function.clone().into_pyobject(py)?.into_any())?,
            self.bytes,
            self.count,
            r(self.summary.clone().into_pyobject(py)?.into_any())?,
            r(self.fix.clone().into_pyobject(py)?.into_any())?,
            r(self.bytes_per_step.into_pyobject(py)?.into_any())?,
            r(self.first_step.into_pyobject(py)?.into_any())?,
            r(self.last_step.into_pyobject(py)?.into_any())?,
            r(self.evidence(py)?.into_any())?,
            r(self.made_at.clone().into_pyobject(py)?.into_any())?,
            r(self.frames.clone().into_pyobject(py)?.into_any())?,
        ))
    }
}

/// The Python findings of the inspector's `findings`, in their order.
pub fn findings_to_py(findings: &[detect::Finding]) -> Vec<Finding> {
    findings.iter().map(Finding::from_inspector).collect()
}

/// The inspector's findings on `snapshot` with its default settings, most severe first, as
/// Python findings (what `SimAllocator.report()` returns).
pub fn findings_of(snapshot: &Snapshot) -> Vec<Finding> {
    findings_to_py(&analysis::findings(snapshot))
}

/// The parts of `snapshot` a report describes, as `vramscope report` chooses them: `device`'s
/// when given; else every device with data, in device order (one part for a single-device
/// snapshot, without the segments of devices that have none). A device without data is an
/// error that lists those with data; so is a snapshot with nothing to analyse, in the words
/// of the command line (`report::nothing_to_analyse`).
pub fn device_parts(
    snapshot: Snapshot,
    device: Option<u32>,
    file: &str,
) -> PyResult<Vec<Snapshot>> {
    if let Some(message) = inspector_report::nothing_to_analyse(&snapshot, file) {
        return Err(PyValueError::new_err(message));
    }
    devices::select(snapshot, device).map_err(PyValueError::new_err)
}

/// One call site's holdings, a row of [`Report::top_sites`].
#[pyclass(module = "vramscope._native", name = "TopSite", frozen, eq, get_all)]
#[derive(Clone, Debug, PartialEq)]
pub struct TopSite {
    /// `file:line`, or `None` when unknown.
    site: Option<String>,
    /// The site's name for a reader: `file:line`, `(unknown site)` or `(before the trace)`.
    label: String,
    /// The function at the site.
    function: String,
    /// Where the row's `bytes` and `blocks` were taken: `"end"` or `"peak"`.
    at: String,
    /// Bytes the site held there.
    bytes: u64,
    /// Blocks the site held there.
    blocks: u64,
    /// Bytes live at the end.
    live_bytes: u64,
    /// Blocks live at the end.
    live_blocks: u64,
    /// Bytes live at the peak of allocated bytes.
    peak_bytes: u64,
    /// Blocks live at the peak.
    peak_blocks: u64,
    /// Allocations the site made in the trace.
    allocations: u64,
    /// Bytes the site allocated in the trace.
    allocated_bytes: u64,
}

#[pymethods]
impl TopSite {
    /// The file of `site`, or `None` when the site is unknown.
    #[getter]
    fn file(&self) -> Option<String> {
        self.site
            .as_deref()
            .and_then(|s| s.rsplit_once(':'))
            .map(|(file, _)| file.to_string())
    }

    /// The line of `site`, or `None` when the site is unknown.
    #[getter]
    fn line(&self) -> Option<u32> {
        self.site
            .as_deref()
            .and_then(|s| s.rsplit_once(':'))
            .and_then(|(_, line)| line.parse().ok())
    }

    fn __repr__(&self) -> String {
        format!(
            "TopSite({:?}, function={:?}, at={:?}, bytes={}, blocks={})",
            self.label, self.function, self.at, self.bytes, self.blocks
        )
    }
}

/// Where [`Report::top_sites`] takes its figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    End,
    Peak,
}

impl At {
    fn parse(at: &str) -> PyResult<At> {
        match at {
            "end" => Ok(At::End),
            "peak" => Ok(At::Peak),
            other => Err(PyValueError::new_err(format!(
                "at={other:?}: expected \"end\" or \"peak\""
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            At::End => "end",
            At::Peak => "peak",
        }
    }
}

/// `vramscope report` on a file: its figures, findings, text, top call sites and the HTML
/// explorer, which a notebook shows inline. A file of several devices is a report of each
/// device ([`Report::devices`], the worst first): its verdict, findings, text, page and
/// dictionary are the whole file's, and its figures those of the worst device, which
/// `device` names.
#[pyclass(module = "vramscope._native", name = "Report", frozen)]
pub struct Report {
    /// Each device's report, in device order.
    parts: Vec<Part>,
    /// The devices' places in `parts`, the worst first (`report::worst_first`).
    order: Vec<usize>,
}

/// One device's report and the call sites behind its `top_sites`.
#[derive(Clone)]
struct Part {
    /// The inspector's report, as the command line builds it (with the explorer's data).
    inner: inspector_report::Report,
    /// Every call site holding memory at the end or at the peak.
    sites: Vec<inspector_report::TopSite>,
}

impl Report {
    /// The report on `snapshot` (one device's), as `vramscope report --format html` builds
    /// it, with `input` as the file named in its headline.
    pub fn from_snapshot(snapshot: &Snapshot, input: Option<String>) -> Report {
        Report::from_parts(std::slice::from_ref(snapshot), input)
    }

    /// The report on a file whose devices' parts are `parts`, in device order.
    pub fn from_parts(parts: &[Snapshot], input: Option<String>) -> Report {
        let parts: Vec<Part> = parts
            .iter()
            .map(|snapshot| {
                let view = ModelView::new(snapshot);
                let mut options = ReportOptions::default();
                options.input = input.clone();
                options.explorer = true;
                let inner = build_report_view(&view, &options);
                let (sites, _) = top_sites_and_rest(&view, usize::MAX);
                Part { inner, sites }
            })
            .collect();
        let inners: Vec<inspector_report::Report> = parts.iter().map(|p| p.inner.clone()).collect();
        let order = inspector_report::worst_first(&inners);
        Report { parts, order }
    }

    /// The worst device's report: the one whose figures the report gives.
    fn primary(&self) -> &Part {
        &self.parts[self.order.first().copied().unwrap_or(0)]
    }

    /// The inspector's report of the worst device.
    pub fn inner(&self) -> &inspector_report::Report {
        &self.primary().inner
    }

    /// Every device's inspector report, in device order.
    fn inners(&self) -> Vec<inspector_report::Report> {
        self.parts.iter().map(|p| p.inner.clone()).collect()
    }

    /// The page inside a frame of `height` pixels, for a notebook's output.
    ///
    /// A `srcdoc` page resolves links against its parent's address, so the page's links to its
    /// own findings (`#finding-0`) would load the notebook into the frame; a `<base>` of
    /// `about:srcdoc` keeps them in the page. The frame is sandboxed with scripts allowed and
    /// no same origin: the explorer runs, but nothing in the page (whose text comes from the
    /// file) can reach the notebook's document, cookies or kernel.
    fn frame(&self, height: u32) -> String {
        let page = html::render_html_framed(&self.inners());
        format!(
            "<div class=\"vramscope-report\"><iframe sandbox=\"allow-scripts\" srcdoc=\"{}\" title=\"{}\" \
             style=\"width:100%;height:{height}px;border:1px solid #ddd;border-radius:4px;\
             background:#fff;display:block\"></iframe></div>",
            html::escape(&page),
            html::escape(&format!("vramscope report: {}", self.verdict()))
        )
    }

    /// The HTML page of the file: one device's explorer, or a device picker.
    fn page(&self) -> String {
        match self.parts.as_slice() {
            [one] => html::render_html(&one.inner),
            _ => html::render_html_file(&self.inners()),
        }
    }
}

#[pymethods]
impl Report {
    /// Where the data came from: `vramscope`, `pytorch` or `chrome-trace`.
    #[getter]
    fn source(&self) -> &str {
        &self.inner().source
    }

    /// The file the report was made from, when it was made from one.
    #[getter]
    fn input(&self) -> Option<&str> {
        self.inner().input.as_deref()
    }

    /// The device's name (`cuda:0`): for a file of several devices, the worst device's,
    /// whose figures the report gives (see `devices`).
    #[getter]
    fn device(&self) -> &str {
        &self.inner().device.name
    }

    /// The device's memory in bytes, or `None` when the file does not record it.
    #[getter]
    fn capacity(&self) -> Option<u64> {
        self.inner().device.capacity_bytes
    }

    /// Loop steps (steps numbered 1 or more).
    #[getter]
    fn steps(&self) -> u64 {
        self.inner().steps
    }

    /// Where the steps came from (the trace's marks, a repeating sequence, or none).
    #[getter]
    fn step_source(&self) -> &str {
        &self.inner().step_source
    }

    /// Events in the trace.
    #[getter]
    fn events(&self) -> u64 {
        self.inner().stats.events
    }

    /// The highest allocated bytes (block sizes, as PyTorch counts them).
    #[getter]
    fn peak_allocated(&self) -> u64 {
        self.inner().stats.peak_allocated_bytes
    }

    /// The highest reserved bytes, or `None` when the file does not record reserved memory.
    #[getter]
    fn peak_reserved(&self) -> Option<u64> {
        self.inner().stats.peak_reserved_bytes
    }

    /// Bytes allocated at the end (live at the end).
    #[getter]
    fn allocated(&self) -> u64 {
        self.inner().stats.allocated_bytes
    }

    /// Bytes reserved at the end, or `None` when not recorded.
    #[getter]
    fn reserved(&self) -> Option<u64> {
        self.inner().stats.reserved_bytes
    }

    /// Blocks live at the end.
    #[getter]
    fn live_blocks(&self) -> u64 {
        self.inner().stats.live_blocks
    }

    /// Every figure of the report, as the `stats` of `vramscope report --format json`
    /// (`None` for what the file does not record).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        data_to_py(py, &self.inner().stats)
    }

    /// What the memory is made of, as `memory_by_category` of `vramscope report --format
    /// json`: `peak` and `end`, bytes per category (`activations`, `parameters`,
    /// `optimizer_state`, `gradients`, `temporaries`, `inputs`, `before_trace`, `unknown`)
    /// that add up to `peak_allocated` and `allocated`, and `series`, the same over time
    /// (`event` and a list per category). For a file of several devices, the worst device's.
    #[getter]
    fn memory_by_category<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = serde_json::to_string(&self.inner().memory_by_category)
            .map_err(|e| PyValueError::new_err(format!("could not convert the figures: {e}")))?;
        json_to_py(py, &json)
    }

    /// The findings of every device, each device's most severe first, the worst device
    /// first; for a file of several devices each says its `device`.
    #[getter]
    fn findings(&self) -> Vec<Finding> {
        let many = self.parts.len() > 1;
        self.order
            .iter()
            .flat_map(|&i| {
                let part = &self.parts[i].inner;
                part.findings.iter().map(move |f| {
                    let finding = Finding::from_inspector(f);
                    if many {
                        finding.on_device(&vramscope_render::device_label(part))
                    } else {
                        finding
                    }
                })
            })
            .collect()
    }

    /// One report per device with data, the worst device first (one for a single-device
    /// file): each with that device's figures, findings, text and page.
    #[getter]
    fn devices(&self) -> Vec<Report> {
        self.order
            .iter()
            .map(|&i| Report {
                parts: vec![self.parts[i].clone()],
                order: vec![0],
            })
            .collect()
    }

    /// The report's one-line verdict: the whole file's, every device counted.
    #[getter]
    fn verdict(&self) -> String {
        file_verdict(&self.inners())
    }

    /// The text report, as `vramscope report` prints it (every device of the file).
    fn summary(&self) -> String {
        let text = render_file(&self.inners(), Format::Text, false);
        vramscope_model::terminal::sanitize_output(&text, false).into_owned()
    }

    /// PyTorch's `memory_summary()` table of the snapshot, or `None` when it has no data.
    fn memory_summary(&self) -> Option<String> {
        self.inner().memory_summary.clone()
    }

    /// The `n` call sites holding the most bytes at the end (`at="end"`) or at the peak of
    /// allocated bytes (`at="peak"`), largest first; sites holding nothing there are left out.
    #[pyo3(signature = (at = "end", n = 10))]
    fn top_sites(&self, at: &str, n: usize) -> PyResult<Vec<TopSite>> {
        let at = At::parse(at)?;
        let held = |t: &inspector_report::TopSite| match at {
            At::End => (t.live_bytes, t.live_blocks),
            At::Peak => (t.peak_bytes, t.peak_blocks),
        };
        let mut rows: Vec<&inspector_report::TopSite> = self
            .primary()
            .sites
            .iter()
            .filter(|t| held(t).0 > 0)
            .collect();
        rows.sort_by(|a, b| {
            held(b)
                .0
                .cmp(&held(a).0)
                .then(held(b).1.cmp(&held(a).1))
                .then(a.label.cmp(&b.label))
        });
        Ok(rows
            .into_iter()
            .take(n)
            .map(|t| TopSite {
                site: t.site.clone(),
                label: t.label.clone(),
                function: t.function.clone(),
                at: at.name().to_string(),
                bytes: held(t).0,
                blocks: held(t).1,
                live_bytes: t.live_bytes,
                live_blocks: t.live_blocks,
                peak_bytes: t.peak_bytes,
                peak_blocks: t.peak_blocks,
                allocations: t.allocations,
                allocated_bytes: t.allocated_bytes,
            })
            .collect())
    }

    /// The report as `vramscope report --format json` writes it, as a dictionary.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &render_file_json(&self.inners()))
    }

    /// The HTML page `vramscope report --format html` writes: the explorer.
    fn html(&self) -> String {
        self.page()
    }

    /// The explorer inside an `<iframe srcdoc>` of `height` pixels, for a notebook's output:
    /// self-contained, its ids and styles kept inside the frame.
    #[pyo3(signature = (height = FRAME_HEIGHT))]
    fn html_frame(&self, height: u32) -> String {
        self.frame(height)
    }

    /// What Jupyter and VS Code show: [`Report::html_frame`] at its default height.
    fn _repr_html_(&self) -> String {
        self.frame(FRAME_HEIGHT)
    }

    fn __str__(&self) -> String {
        self.summary()
    }

    fn __repr__(&self) -> String {
        let one = format!(
            "{}: peak allocated {}, {} at the end, {} steps; {}",
            headline(self.inner()),
            format_bytes(self.inner().stats.peak_allocated_bytes),
            format_bytes(self.inner().stats.allocated_bytes),
            self.inner().steps,
            self.inner().counts_phrase(),
        );
        if self.parts.len() == 1 {
            return format!("<vramscope.Report {one}>");
        }
        format!(
            "<vramscope.Report of {} devices: {}; the worst, {one}>",
            self.parts.len(),
            self.verdict()
        )
    }
}
