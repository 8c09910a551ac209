//! A big job's ranks from Python: [`rank_summary`] reduces one rank's file to its summary
//! where the file is (a Dask or Ray worker: the map), [`compare_ranks`] compares the
//! summaries wherever they were gathered (the reduce), as `vramscope summarize` and
//! `vramscope ranks` do on the command line. A summary pickles as its JSON, so a cluster's
//! engine carries it between processes; the comparison is the one `ranks` makes of the same
//! files, byte for byte in JSON.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use vramscope_analysis::ranks;

/// One rank's file reduced to what the comparison needs (kilobytes): `vramscope
/// summarize`'s JSON. Picklable; `RankSummary(json)` reads one back.
#[pyclass(module = "vramscope._native", name = "RankSummary", frozen, eq)]
#[derive(Clone, Debug, PartialEq)]
pub struct RankSummary {
    inner: ranks::RankSummary,
}

#[pymethods]
impl RankSummary {
    /// A summary from its JSON (what [`RankSummary::json`] and `vramscope summarize` write).
    #[new]
    fn new(json: &str) -> PyResult<Self> {
        ranks::summary_from_json(json)
            .map(|inner| RankSummary { inner })
            .map_err(PyValueError::new_err)
    }

    /// The snapshot's file, as it was named when summarized.
    #[getter]
    fn file(&self) -> String {
        self.inner.file.clone()
    }

    /// The rank the file name gives, if it gives one.
    #[getter]
    fn rank(&self) -> Option<u32> {
        self.inner.rank
    }

    /// Why the file was skipped (it could not be read, or holds nothing), or `None`.
    #[getter]
    fn skipped(&self) -> Option<String> {
        self.inner.skipped.as_ref().map(|s| s.error.clone())
    }

    /// The largest peak of allocated bytes of the file's devices (0 for a skipped file).
    #[getter]
    fn peak_allocated(&self) -> u64 {
        self.inner
            .devices
            .iter()
            .map(|d| d.peak_allocated)
            .max()
            .unwrap_or(0)
    }

    /// The summary as JSON, as `vramscope summarize` writes it.
    fn json(&self) -> String {
        ranks::summary_to_json(&self.inner)
    }

    /// Pickles as `RankSummary(json)`.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, PyType>, (String,)) {
        (slf.get_type(), (ranks::summary_to_json(&slf.get().inner),))
    }

    fn __repr__(&self) -> String {
        let rank = self.inner.rank.map_or("?".to_string(), |r| r.to_string());
        match &self.inner.skipped {
            Some(s) => format!(
                "<RankSummary rank {rank} of {:?}: skipped, {}>",
                self.inner.file, s.skipped
            ),
            None => format!(
                "<RankSummary rank {rank} of {:?}: peak {}>",
                self.inner.file,
                vramscope_model::format_bytes(self.peak_allocated())
            ),
        }
    }
}

/// The comparison of a job's ranks: `vramscope ranks` on the same files.
#[pyclass(module = "vramscope._native", name = "RankComparison", frozen)]
pub struct RankComparison {
    inner: ranks::RankComparison,
}

#[pymethods]
impl RankComparison {
    /// The ranks that stand out, in rank order.
    #[getter]
    fn stand_out(&self) -> Vec<u32> {
        self.inner.stand_out()
    }

    /// The compared ranks that do not stand out, in rank order.
    #[getter]
    fn alike(&self) -> Vec<u32> {
        self.inner.alike()
    }

    /// The skipped ranks: `(rank, why)`, in rank order.
    #[getter]
    fn skipped(&self) -> Vec<(u32, String)> {
        self.inner
            .failed
            .iter()
            .map(|f| (f.rank, f.error.clone()))
            .collect()
    }

    /// How the ranks were numbered: `"file names"`, or why by place in the list.
    #[getter]
    fn numbering(&self) -> String {
        self.inner.numbering.clone()
    }

    /// The comparison as `vramscope ranks --format json` prints it, byte for byte.
    fn json(&self) -> String {
        let text = vramscope_render::ranks::render_json(&self.inner);
        vramscope_model::terminal::sanitize_json(&text).into_owned()
    }

    /// The comparison as `vramscope ranks` prints it (every rank's row when `all`).
    #[pyo3(signature = (all = false))]
    fn text(&self, all: bool) -> String {
        let text = vramscope_render::ranks::render_text_rows(&self.inner, all);
        vramscope_model::terminal::sanitize_output(&text, false).into_owned()
    }

    /// The comparison in markdown (every rank's row when `all`).
    #[pyo3(signature = (all = false))]
    fn markdown(&self, all: bool) -> String {
        vramscope_render::ranks::render_markdown_rows(&self.inner, all)
    }

    fn __repr__(&self) -> String {
        format!(
            "<RankComparison of {} ranks: {} stand out>",
            self.inner.ranks.len() + self.inner.failed.len(),
            self.inner.stand_out().len()
        )
    }
}

/// The summary of the rank's file at `path` (a snapshot, or a summary already), read off the
/// interpreter. A file that cannot be read gives a summary that says why.
#[pyfunction]
pub fn rank_summary(py: Python<'_>, path: String) -> PyResult<RankSummary> {
    crate::off_the_interpreter(py, move || {
        Ok(RankSummary {
            inner: ranks::read_rank(std::path::Path::new(&path)),
        })
    })
}

/// Compares the ranks of `summaries`, as `vramscope ranks` does.
#[pyfunction]
pub fn compare_ranks(summaries: Vec<PyRef<'_, RankSummary>>) -> RankComparison {
    let summaries: Vec<ranks::RankSummary> = summaries.iter().map(|s| s.inner.clone()).collect();
    RankComparison {
        inner: ranks::compare_summaries(&summaries),
    }
}
