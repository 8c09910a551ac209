//! What grew and what shrank between two snapshots, by call site.
//!
//! Each snapshot is reduced by `crate::model_view` to the bytes and blocks each `file:line`
//! holds at a moment of its own ([`At`]): at its end (the default), or at its peak of allocated
//! bytes, the holdings the report's Top sites "peak" column shows (site ids differ between
//! files, so sites are matched by `file:line`, never by id). [`diff`] and [`diff_at`] subtract
//! the two; [`render_text`] and [`render_json`] print the result for `vramscope diff A B
//! [--at end|peak]`, with both runs' peaks and their difference in the header whatever the
//! moment. Typical uses: a snapshot after step 10 against one after step 20 shows which call
//! sites keep memory that they should have released (at the end); two configurations of one
//! job show which sites make one peak higher than the other (at the peak).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use vramscope_model::{format_bytes, Snapshot};

use crate::model_view::ModelView;

/// Version of the JSON diff schema (fields are only ever added within a version: `at` and
/// the peaks came with `--at`).
pub const DIFF_FORMAT_VERSION: u32 = 1;

/// The moment of each run whose holdings a diff compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    /// What is live at the end of each snapshot.
    #[default]
    End,
    /// What each run held at its own peak of allocated bytes (the state after the event that
    /// first reached it, memory from before the trace included): the report's "at peak"
    /// column, which sums to the peak.
    Peak,
}

impl At {
    /// `end` or `peak`.
    pub fn as_str(self) -> &'static str {
        match self {
            At::End => "end",
            At::Peak => "peak",
        }
    }
}

impl std::str::FromStr for At {
    type Err = String;

    fn from_str(s: &str) -> Result<At, String> {
        match s.to_ascii_lowercase().as_str() {
            "end" => Ok(At::End),
            "peak" => Ok(At::Peak),
            _ => Err(format!("unknown moment `{s}` (expected end or peak)")),
        }
    }
}

/// One call site's holdings in both snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteDelta {
    /// `file:line`, or null for blocks without a known site.
    pub site: Option<String>,
    /// The site's name for a reader: `file:line`, `(unknown site)` or `(before the trace)`.
    pub label: String,
    /// Function at the site (from whichever snapshot names it).
    pub function: String,
    /// Bytes the site holds in the first snapshot at the moment compared ([`Diff::at`]).
    pub before_bytes: u64,
    /// Bytes the site holds in the second snapshot at the moment compared.
    pub after_bytes: u64,
    /// Blocks the site holds in the first snapshot at the moment compared.
    pub before_blocks: u64,
    /// Blocks the site holds in the second snapshot at the moment compared.
    pub after_blocks: u64,
    /// `after_bytes - before_bytes`.
    pub delta_bytes: i64,
    /// `after_blocks - before_blocks`.
    pub delta_blocks: i64,
}

/// The difference between two snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diff {
    /// [`DIFF_FORMAT_VERSION`].
    pub format_version: u32,
    /// The moment of each run compared: its end or its peak.
    pub at: At,
    /// Peak allocated bytes of the first snapshot (memory from before the trace included).
    pub before_peak_bytes: u64,
    /// Peak allocated bytes of the second snapshot.
    pub after_peak_bytes: u64,
    /// `after_peak_bytes - before_peak_bytes`.
    pub delta_peak_bytes: i64,
    /// Total bytes held at the moment compared in the first snapshot (at the peak: its peak).
    pub before_bytes: u64,
    /// Total bytes held at the moment compared in the second snapshot.
    pub after_bytes: u64,
    /// Total blocks held at the moment compared in the first snapshot.
    pub before_blocks: u64,
    /// Total blocks held at the moment compared in the second snapshot.
    pub after_blocks: u64,
    /// Sites holding more bytes (or more blocks) afterwards, largest growth first.
    pub grew: Vec<SiteDelta>,
    /// Sites holding fewer bytes (or fewer blocks) afterwards, largest shrink first.
    pub shrank: Vec<SiteDelta>,
    /// Sites holding the same in both.
    pub unchanged: u64,
}

/// Compares what each call site holds at the end of `before` and of `after`.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Diff {
    diff_at(before, after, At::End)
}

/// Compares what each call site holds at the moment `at` of `before` and of `after` (each
/// run's own end, or its own peak).
pub fn diff_at(before: &Snapshot, after: &Snapshot, at: At) -> Diff {
    diff_views_at(&ModelView::new(before), &ModelView::new(after), at)
}

/// Compares two views built earlier, at their ends.
pub fn diff_views(before: &ModelView<'_>, after: &ModelView<'_>) -> Diff {
    diff_views_at(before, after, At::End)
}

/// Compares two views built earlier, at the moment `at` of each.
pub fn diff_views_at(before: &ModelView<'_>, after: &ModelView<'_>, at: At) -> Diff {
    let mut sites: BTreeMap<String, SiteDelta> = BTreeMap::new();
    let mut add = |view: &ModelView<'_>, is_after: bool| {
        let holdings = match at {
            At::End => view.live_at_end(),
            At::Peak => view.live_at_peak(),
        };
        for h in holdings {
            let group = view.group(h.group);
            let row = sites
                .entry(group.label().to_string())
                .or_insert_with(|| SiteDelta {
                    site: group.file_line.clone(),
                    label: group.label().to_string(),
                    function: String::new(),
                    before_bytes: 0,
                    after_bytes: 0,
                    before_blocks: 0,
                    after_blocks: 0,
                    delta_bytes: 0,
                    delta_blocks: 0,
                });
            if row.function.is_empty() {
                row.function = group.function.clone();
            }
            if is_after {
                row.after_bytes = row.after_bytes.saturating_add(h.bytes);
                row.after_blocks = row.after_blocks.saturating_add(h.blocks);
            } else {
                row.before_bytes = row.before_bytes.saturating_add(h.bytes);
                row.before_blocks = row.before_blocks.saturating_add(h.blocks);
            }
        }
    };
    add(before, false);
    add(after, true);

    let mut result = Diff {
        format_version: DIFF_FORMAT_VERSION,
        at,
        before_peak_bytes: before.peak_allocated(),
        after_peak_bytes: after.peak_allocated(),
        delta_peak_bytes: delta(after.peak_allocated(), before.peak_allocated()),
        before_bytes: 0,
        after_bytes: 0,
        before_blocks: 0,
        after_blocks: 0,
        grew: Vec::new(),
        shrank: Vec::new(),
        unchanged: 0,
    };
    for (_, mut row) in sites {
        row.delta_bytes = delta(row.after_bytes, row.before_bytes);
        row.delta_blocks = delta(row.after_blocks, row.before_blocks);
        result.before_bytes = result.before_bytes.saturating_add(row.before_bytes);
        result.after_bytes = result.after_bytes.saturating_add(row.after_bytes);
        result.before_blocks = result.before_blocks.saturating_add(row.before_blocks);
        result.after_blocks = result.after_blocks.saturating_add(row.after_blocks);
        if row.delta_bytes > 0 || (row.delta_bytes == 0 && row.delta_blocks > 0) {
            result.grew.push(row);
        } else if row.delta_bytes < 0 || row.delta_blocks < 0 {
            result.shrank.push(row);
        } else {
            result.unchanged += 1;
        }
    }
    // Stable sorts over rows already ordered by site keep ties in site order.
    result.grew.sort_by(|a, b| {
        b.delta_bytes
            .cmp(&a.delta_bytes)
            .then(b.delta_blocks.cmp(&a.delta_blocks))
    });
    result.shrank.sort_by(|a, b| {
        a.delta_bytes
            .cmp(&b.delta_bytes)
            .then(a.delta_blocks.cmp(&b.delta_blocks))
    });
    result
}

/// `after - before`, clamped to the range of `i64`.
fn delta(after: u64, before: u64) -> i64 {
    (i128::from(after) - i128::from(before)).clamp(i128::from(i64::MIN), i128::from(i64::MAX))
        as i64
}

fn signed_bytes(delta: i64) -> String {
    if delta < 0 {
        format!("-{}", format_bytes(delta.unsigned_abs()))
    } else {
        format!("+{}", format_bytes(delta as u64))
    }
}

/// The diff as text: both runs' peaks, then what they held at the moment compared, then the
/// sites that grew and shrank.
pub fn render_text(diff: &Diff) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "peak allocated: {} -> {} ({})",
        format_bytes(diff.before_peak_bytes),
        format_bytes(diff.after_peak_bytes),
        signed_bytes(diff.delta_peak_bytes)
    );
    let moment = match diff.at {
        At::End => "live at the end",
        At::Peak => "held at each run's peak",
    };
    let _ = writeln!(
        out,
        "{moment}: {} in {} blocks -> {} in {} blocks ({}, {:+} blocks)",
        format_bytes(diff.before_bytes),
        diff.before_blocks,
        format_bytes(diff.after_bytes),
        diff.after_blocks,
        signed_bytes(delta(diff.after_bytes, diff.before_bytes)),
        delta(diff.after_blocks, diff.before_blocks)
    );
    for (title, rows) in [("grew", &diff.grew), ("shrank", &diff.shrank)] {
        let _ = writeln!(out, "\n{title} ({}):", rows.len());
        if rows.is_empty() {
            let _ = writeln!(out, "  none");
        }
        for r in rows {
            let site = &r.label;
            // A site named by its function already (`AccumulateGrad (backward)`) does not
            // repeat it.
            let function = if r.function.is_empty() || site.contains(r.function.as_str()) {
                String::new()
            } else {
                format!(" ({})", r.function)
            };
            // Names from the files, escaped for the terminal (`crate::terminal`).
            let (site, function) = (
                vramscope_model::terminal::sanitize(site),
                vramscope_model::terminal::sanitize(&function),
            );
            let _ = writeln!(
                out,
                "  {:>11} {:>+7} blocks  {:>10} -> {:<10}  {site}{function}",
                signed_bytes(r.delta_bytes),
                r.delta_blocks,
                format_bytes(r.before_bytes),
                format_bytes(r.after_bytes),
            );
        }
    }
    if diff.unchanged > 0 {
        let _ = writeln!(out, "\n{} site(s) unchanged", diff.unchanged);
    }
    out
}

/// The diff as pretty-printed JSON.
pub fn render_json(diff: &Diff) -> String {
    let mut text = serde_json::to_string_pretty(diff)
        .unwrap_or_else(|e| format!("{{\"error\": \"could not serialize the diff: {e}\"}}"));
    text.push('\n');
    text
}
