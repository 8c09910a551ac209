//! The sweep: the trace replayed under every setting of [`sweep_configs`], and the one setting
//! it recommends, only where a change changes the outcome ([`recommend`]).

use super::*;

/// One row of a settings sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepRow {
    /// The settings tried.
    pub config: String,
    /// Whether these are the settings the trace recorded or those given, besides (or rather
    /// than) one of [`sweep_configs`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<SettingsOrigin>,
    /// The replay under them.
    pub result: ReplayResult,
    /// Whether the run fits: no OOM, peak reserved within the capacity, and a start state
    /// within it ([`ReplayResult::start_over_capacity`]).
    pub fits: bool,
    /// Whether these are the settings the others are weighed against ([`recommend`]): the
    /// trace's own, or PyTorch's defaults for a trace that records none.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
    /// Whether the sweep recommends changing to these settings ([`recommend`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub recommended: bool,
}

/// The least saving of peak reserved bytes, in percent of the baseline's peak reserved, that
/// makes a setting that fits where the baseline fits worth recommending (with
/// [`MATERIAL_SAVING_BYTES`]): less is within what a run's own variation moves.
pub const MATERIAL_SAVING_PERCENT: u64 = 10;

/// The least saving of peak reserved bytes that makes a setting worth recommending where the
/// baseline fits (with [`MATERIAL_SAVING_PERCENT`]): 256 MiB, about what a batch-size step or
/// another process's context takes, so that a small run is not told to change for megabytes.
pub const MATERIAL_SAVING_BYTES: u64 = 256 << 20;

/// Whether `reserved` instead of `baseline` peak reserved bytes is a material saving: at
/// least [`MATERIAL_SAVING_PERCENT`] of `baseline` and at least [`MATERIAL_SAVING_BYTES`].
pub fn material_saving(baseline: u64, reserved: u64) -> bool {
    let saving = baseline.saturating_sub(reserved);
    saving >= MATERIAL_SAVING_BYTES
        && u128::from(saving) * 100 >= u128::from(baseline) * u128::from(MATERIAL_SAVING_PERCENT)
}

/// The row of `rows` the others are weighed against: the trace's own settings when it
/// records any, else PyTorch's defaults.
pub(crate) fn baseline_row(rows: &[SweepRow]) -> Option<usize> {
    rows.iter()
        .position(|r| r.origin == Some(SettingsOrigin::Recorded))
        .or_else(|| rows.iter().position(|r| r.config == "(defaults)"))
}

/// Whether a row's settings are vramscope's own (a placement policy), which PyTorch does not
/// accept.
pub(crate) fn vramscope_only(row: &SweepRow) -> bool {
    row.config.contains("policy:")
}

/// The row of a sweep worth changing to, if any: a setting is recommended only when it
/// changes the outcome against the baseline (the trace's own settings, or PyTorch's defaults).
/// Where the baseline does not fit, the PyTorch setting that fits with the lowest peak
/// reserved (an OOM avoided); where it fits, or where no setting can fit because the start
/// state alone exceeds the capacity, the one that reserves least, if that is a
/// [`material_saving`] over the baseline. vramscope's own placement policies are never
/// recommended (PyTorch does not accept them).
pub fn recommend(rows: &[SweepRow]) -> Option<usize> {
    let index = baseline_row(rows)?;
    let baseline = &rows[index];
    let reserved = |row: &SweepRow| row.result.figures.peak_reserved.unwrap_or(u64::MAX);
    let start_over = baseline.result.start_over_capacity.is_some();
    let best = rows
        .iter()
        .enumerate()
        .filter(|&(i, row)| i != index && !vramscope_only(row))
        .filter(|(_, row)| row.fits || (start_over && !baseline.fits))
        .min_by_key(|&(i, row)| (reserved(row), i))?;
    if baseline.fits || start_over {
        material_saving(reserved(baseline), reserved(best.1)).then_some(best.0)
    } else {
        Some(best.0)
    }
}

/// Where the settings of a sweep's row came from, when not only from the sweep's own list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettingsOrigin {
    /// The settings the trace was recorded with ([`trace_settings`]).
    Recorded,
    /// The settings the caller gave.
    Given,
}

/// The settings a sweep tries: PyTorch's defaults, expandable segments, several
/// `max_split_size_mb` values, power-of-two rounding, and each policy.
pub fn sweep_configs() -> Vec<AllocatorConfig> {
    [
        "",
        "expandable_segments:True",
        "max_split_size_mb:64",
        "max_split_size_mb:128",
        "max_split_size_mb:256",
        "max_split_size_mb:512",
        "roundup_power2_divisions:4",
        "max_split_size_mb:128,roundup_power2_divisions:4",
        "policy:compact",
    ]
    .iter()
    .map(|text| AllocatorConfig::parse(text).expect("built-in sweep settings parse"))
    .collect()
}

/// Replays `snapshot` under every setting of [`sweep_configs`], and under the settings the
/// trace recorded ([`trace_settings`]) when they are not the defaults, against `capacity`,
/// best fit first (fits, then lowest peak reserved). The row of the trace's settings says so
/// ([`SweepRow::origin`]).
pub fn sweep(
    snapshot: &Snapshot,
    capacity: Option<u64>,
    progress: &mut dyn FnMut(usize, usize),
) -> Vec<SweepRow> {
    sweep_with(snapshot, capacity, None, progress)
}

/// [`sweep`], also under `given` (the settings a caller asked for), whose row says so.
pub fn sweep_with(
    snapshot: &Snapshot,
    capacity: Option<u64>,
    given: Option<&AllocatorConfig>,
    progress: &mut dyn FnMut(usize, usize),
) -> Vec<SweepRow> {
    let mut configs: Vec<(AllocatorConfig, Option<SettingsOrigin>)> =
        sweep_configs().into_iter().map(|c| (c, None)).collect();
    let recorded = trace_settings(snapshot);
    let mut mark = |config: AllocatorConfig, origin: SettingsOrigin| match configs
        .iter_mut()
        .find(|(c, _)| *c == config)
    {
        Some((_, mark)) => *mark = Some(origin),
        None => configs.push((config, Some(origin))),
    };
    if recorded != AllocatorConfig::default() {
        mark(recorded, SettingsOrigin::Recorded);
    }
    if let Some(given) = given {
        mark(placement(given), SettingsOrigin::Given);
    }
    let estimated = block_sizing(snapshot) == Some(BlockSizing::Rounded);
    // The trace's own figures and start, the same under every setting: walked once, and the
    // rest of the walk (its usage per event) dropped before the replays.
    let (start, original) = {
        let walk = Reconstruction::from_snapshot(snapshot);
        let mut original = original_figures(snapshot, &walk, device_of(snapshot));
        original.peak_allocated_estimated = estimated;
        (walk.start, original)
    };
    let count = configs.len();
    let mut rows: Vec<SweepRow> = configs
        .into_iter()
        .enumerate()
        .map(|(i, (config, origin))| {
            let options = ReplayOptions {
                capacity,
                config,
                ..ReplayOptions::default()
            };
            let result = replay_recording(
                snapshot,
                &options,
                &mut |_, _| {},
                &mut Keep::Walked {
                    start: &start,
                    original: &original,
                },
            );
            progress(i + 1, count);
            let fits = result.figures.num_ooms == Some(0)
                && result.first_oom.is_none()
                && result.start_over_capacity.is_none()
                && result.figures.peak_reserved.unwrap_or(0) <= result.capacity;
            SweepRow {
                config: if result.config.is_empty() {
                    "(defaults)".to_string()
                } else {
                    result.config.clone()
                },
                origin,
                result,
                fits,
                baseline: false,
                recommended: false,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.fits.cmp(&a.fits).then(
            a.result
                .figures
                .peak_reserved
                .cmp(&b.result.figures.peak_reserved),
        )
    });
    if let Some(baseline) = baseline_row(&rows) {
        rows[baseline].baseline = true;
    }
    if let Some(recommended) = recommend(&rows) {
        rows[recommended].recommended = true;
    }
    rows
}
