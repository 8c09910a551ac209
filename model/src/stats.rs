//! PyTorch-compatible memory statistics: the figures of `torch.cuda.memory_stats()` under the same
//! names, and the aligned `memory_summary()` table.
//!
//! The caching allocator (`vramscope_allocator::caching`) updates a [`MemoryStats`] under its
//! device lock on every allocation, free and segment change; snapshots (`crate::snapshot`) carry a
//! copy, and the inspector prints the same table for imported files.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Pool;

/// One statistic: its current value, its peak, and the running totals added and removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Current value.
    pub current: u64,
    /// Highest value since creation or the last `reset_peak_stats()`.
    pub peak: u64,
    /// Total ever added.
    pub allocated: u64,
    /// Total ever removed.
    pub freed: u64,
}

impl Stat {
    /// Adds `amount` to the current value, updating the peak and the total allocated.
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount;
        self.allocated += amount;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    /// Removes `amount` from the current value and adds it to the total freed.
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        debug_assert!(self.current >= amount, "statistic would go negative");
        self.current = self.current.saturating_sub(amount);
        self.freed += amount;
    }

    /// Sets the peak to the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// A statistic for all pools together and for each pool alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatArray {
    /// Both pools together.
    pub all: Stat,
    /// The small pool (requests ≤ 1 MiB).
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// Adds `amount` to `all` and to `pool`.
    #[inline]
    pub fn increase(&mut self, pool: Pool, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    /// Removes `amount` from `all` and from `pool`.
    #[inline]
    pub fn decrease(&mut self, pool: Pool, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    /// The statistic of one pool.
    pub fn pool(&self, pool: Pool) -> &Stat {
        match pool {
            Pool::Small => &self.small_pool,
            Pool::Large => &self.large_pool,
        }
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut Stat {
        match pool {
            Pool::Small => &mut self.small_pool,
            Pool::Large => &mut self.large_pool,
        }
    }

    /// Resets every peak to its current value.
    pub fn reset_peak(&mut self) {
        self.all.reset_peak();
        self.small_pool.reset_peak();
        self.large_pool.reset_peak();
    }
}

/// The statistics PyTorch's caching allocator keeps, under PyTorch's names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Bytes in blocks handed out to the program.
    pub allocated_bytes: StatArray,
    /// Bytes obtained from the device (segments).
    pub reserved_bytes: StatArray,
    /// Bytes in blocks allocated or pending free.
    pub active_bytes: StatArray,
    /// Bytes in free blocks inside segments that also hold an active block (not releasable).
    pub inactive_split_bytes: StatArray,
    /// Bytes the program asked for (before rounding).
    pub requested_bytes: StatArray,
    /// Number of blocks handed out.
    pub allocation: StatArray,
    /// Number of segments.
    pub segment: StatArray,
    /// Number of blocks allocated or pending free.
    pub active: StatArray,
    /// Number of free blocks inside segments that also hold an active block.
    pub inactive_split: StatArray,
    /// Raw allocations that failed and were retried after freeing the cache.
    pub num_alloc_retries: u64,
    /// Allocations that failed for good.
    pub num_ooms: u64,
    /// Times every stream was synchronized to free the cache.
    pub num_sync_all_streams: u64,
    /// Raw device allocations (including expandable page maps).
    pub num_device_alloc: u64,
    /// Raw device frees (including expandable page unmaps).
    pub num_device_free: u64,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
}

impl MemoryStats {
    /// Reserved bytes that no live block uses: the cache.
    pub fn cached_bytes(&self) -> u64 {
        self.reserved_bytes
            .all
            .current
            .saturating_sub(self.allocated_bytes.all.current)
    }

    /// Allocated over reserved, in 0..=1 (1 when nothing is reserved).
    pub fn utilization(&self) -> f64 {
        let reserved = self.reserved_bytes.all.current;
        if reserved == 0 {
            1.0
        } else {
            self.allocated_bytes.all.current as f64 / reserved as f64
        }
    }

    /// Bytes lost to rounding and unsplit remainders in live blocks.
    pub fn rounding_waste(&self) -> u64 {
        self.allocated_bytes
            .all
            .current
            .saturating_sub(self.requested_bytes.all.current)
    }

    /// Resets every peak to its current value.
    pub fn reset_peak(&mut self) {
        for array in [
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
        ] {
            array.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// The `memory_summary()` table, at most 80 columns wide.
    pub fn summary(&self) -> String {
        self.to_string()
    }
}

/// How many characters of a name (a file path, a function) a label repeated per event or per
/// step keeps: enough for any real name, and a bound on what a file's one long name can cost
/// when it is written thousands of times.
pub const LABEL_CHARS: usize = 240;

/// `text` when it has at most `max_chars` characters; else its last `max_chars - 1` after
/// `…` (for paths, whose end names the file), or nothing when `max_chars` is 0. The
/// dashboard's panels cut their columns with it too.
pub fn elide_start(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    if max_chars == 0 {
        return "".into();
    }
    match text.char_indices().rev().nth(max_chars - 1) {
        Some((at, _)) if at > 0 => {
            let keep = text[at..].chars().skip(1).collect::<String>();
            format!("…{keep}").into()
        }
        _ => text.into(),
    }
}

/// `text` when it has at most `max_chars` characters; else its first `max_chars - 1` and
/// `…` (for function names, whose start names the function), or nothing when `max_chars` is
/// 0.
pub fn elide_end(text: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    if max_chars == 0 {
        return "".into();
    }
    match text.char_indices().nth(max_chars) {
        Some(_) => {
            let keep: String = text.chars().take(max_chars - 1).collect();
            format!("{keep}…").into()
        }
        None => text.into(),
    }
}

/// `count` and `noun`, the noun in the plural unless the count is one (`1 step`, `3 passes`),
/// as every report sentence writes counts.
pub fn plural(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else if noun.ends_with('s') || noun.ends_with("sh") || noun.ends_with("ch") {
        format!("{count} {noun}es")
    } else {
        format!("{count} {noun}s")
    }
}

/// A count with thousands separators (`1,130,496`), as the dashboard and progress lines write
/// large counts.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats a byte count with a binary unit, at most 7 characters (`1023 B`, `12.5 MiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value >= 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Parses a byte count: a plain number of bytes, or a number with a unit (`B`, `K`/`KB`/`KiB`,
/// `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB`; all binary, case-insensitive, spaces
/// allowed), such as `24GiB` or `1.5 T`.
///
/// ```
/// use vramscope_model::parse_bytes;
/// assert_eq!(parse_bytes("24GiB"), Ok(24 << 30));
/// assert_eq!(parse_bytes("512"), Ok(512));
/// assert!(parse_bytes("lots").is_err());
/// ```
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (write e.g. 24GiB, 512M or 1048576)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => return Err(format!("unknown size unit `{other}` in `{text}`")),
    };
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// Which figures of a [`MemoryStats`] the data behind it records, for
/// [`MemoryStats::summary_recorded`]: a figure that is not recorded prints as `n/a`, never as a
/// zero that reads like a measurement.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recorded {
    /// Rows of the table (by the metric name it prints, e.g. `"Active memory"`) that are
    /// recorded; `None` means every row.
    pub metrics: Option<Vec<&'static str>>,
    /// Whether the per-pool rows (`from large pool`, `from small pool`) are recorded.
    pub pools: bool,
    /// Whether the running totals (`Tot Alloc`, `Tot Freed`) are recorded.
    pub totals: bool,
    /// Rows (by metric name) of which only the current value is recorded: their peak and
    /// totals print as `n/a` (a dump-time figure, such as a PyTorch snapshot's non-releasable
    /// memory, has no history).
    pub current_only: Vec<&'static str>,
}

impl Recorded {
    /// Every figure is recorded (an allocator's own statistics).
    pub fn all() -> Recorded {
        Recorded {
            metrics: None,
            pools: true,
            totals: true,
            current_only: Vec::new(),
        }
    }

    /// Only the named rows' all-pools current and peak values are recorded.
    pub fn only(metrics: Vec<&'static str>) -> Recorded {
        Recorded {
            metrics: Some(metrics),
            pools: false,
            totals: false,
            current_only: Vec::new(),
        }
    }

    /// These settings with only the named rows recorded.
    pub fn with_metrics(mut self, metrics: Vec<&'static str>) -> Recorded {
        self.metrics = Some(metrics);
        self
    }

    /// These settings with only the current value of the named rows recorded (their peak and
    /// totals print as `n/a`).
    pub fn with_current_only(mut self, metrics: Vec<&'static str>) -> Recorded {
        self.current_only = metrics;
        self
    }

    fn has(&self, metric: &str) -> bool {
        self.metrics
            .as_ref()
            .is_none_or(|list| list.contains(&metric))
    }
}

impl MemoryStats {
    /// [`MemoryStats::summary`], with `n/a` for every figure `recorded` says the data does not
    /// record.
    pub fn summary_recorded(&self, recorded: &Recorded) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_table(&mut out, recorded);
        out
    }

    fn write_table(&self, f: &mut dyn fmt::Write, recorded: &Recorded) -> fmt::Result {
        const RULE: &str =
            "|==============================================================================|";
        const THIN: &str =
            "|------------------------------------------------------------------------------|";
        const NA: &str = "n/a";
        writeln!(f, "{RULE}")?;
        writeln!(f, "| {:<76} |", "vramscope memory summary")?;
        writeln!(f, "{THIN}")?;
        writeln!(
            f,
            "| {:<24} | {:>10} | {:>10} | {:>10} | {:>10} |",
            "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
        )?;
        let rows: [(&str, &StatArray, bool); 9] = [
            ("Allocated memory", &self.allocated_bytes, true),
            ("Active memory", &self.active_bytes, true),
            ("Requested memory", &self.requested_bytes, true),
            ("GPU reserved memory", &self.reserved_bytes, true),
            ("Non-releasable memory", &self.inactive_split_bytes, true),
            ("Allocations", &self.allocation, false),
            ("Active allocs", &self.active, false),
            ("GPU reserved segments", &self.segment, false),
            ("Non-releasable allocs", &self.inactive_split, false),
        ];
        for (name, array, bytes) in rows {
            writeln!(f, "{THIN}")?;
            let known_row = recorded.has(name);
            let current_only = recorded.current_only.contains(&name);
            for (label, stat, pool) in [
                (name.to_string(), &array.all, false),
                ("  from large pool".to_string(), &array.large_pool, true),
                ("  from small pool".to_string(), &array.small_pool, true),
            ] {
                let known = known_row && (!pool || recorded.pools);
                // `history`: a peak or a running total, not the current value.
                let cell = |v: u64, total: bool, history: bool| {
                    if !known || (total && !recorded.totals) || (history && current_only) {
                        NA.to_string()
                    } else if bytes {
                        format_bytes(v)
                    } else {
                        v.to_string()
                    }
                };
                writeln!(
                    f,
                    "| {:<24} | {:>10} | {:>10} | {:>10} | {:>10} |",
                    label,
                    cell(stat.current, false, false),
                    cell(stat.peak, false, true),
                    cell(stat.allocated, true, true),
                    cell(stat.freed, true, true)
                )?;
            }
        }
        let count = |name: &str, v: u64| {
            if recorded.has(name) {
                v.to_string()
            } else {
                NA.to_string()
            }
        };
        writeln!(f, "{THIN}")?;
        writeln!(
            f,
            "| {:<24} | {:>10} | {:<23} | {:>10} |",
            "Device allocs",
            count("Device allocs", self.num_device_alloc),
            "Device frees",
            count("Device frees", self.num_device_free)
        )?;
        writeln!(
            f,
            "| {:<24} | {:>10} | {:<23} | {:>10} |",
            "Alloc retries",
            count("Alloc retries", self.num_alloc_retries),
            "OOMs",
            count("OOMs", self.num_ooms)
        )?;
        let utilization = if recorded.has("Allocated memory") && recorded.has("GPU reserved memory")
        {
            format!("{:.1} %", self.utilization() * 100.0)
        } else {
            NA.to_string()
        };
        writeln!(
            f,
            "| {:<24} | {:>10} | {:<23} | {:>10} |",
            "Sync all streams",
            count("Sync all streams", self.num_sync_all_streams),
            "Utilization",
            utilization
        )?;
        writeln!(f, "{RULE}")
    }
}

impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_table(f, &Recorded::all())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits_in_threes() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_130_496), "1,130,496");
        assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        s.increase(1);
        assert_eq!(s.current, 4);
        assert_eq!(s.peak, 15);
        assert_eq!(s.allocated, 16);
        assert_eq!(s.freed, 12);
        s.reset_peak();
        assert_eq!(s.peak, 4);
    }

    #[test]
    fn stat_array_updates_pool_and_all() {
        let mut a = StatArray::default();
        a.increase(Pool::Small, 512);
        a.increase(Pool::Large, 2048);
        a.decrease(Pool::Small, 512);
        assert_eq!(a.all.current, 2048);
        assert_eq!(a.small_pool.current, 0);
        assert_eq!(a.small_pool.peak, 512);
        assert_eq!(a.pool(Pool::Large).current, 2048);
    }

    #[test]
    fn parses_sizes_with_units() {
        assert_eq!(parse_bytes("1.5 KiB"), Ok(1536));
        assert_eq!(parse_bytes("2t"), Ok(2 << 40));
        assert_eq!(parse_bytes(" 7 MB "), Ok(7 << 20));
        assert!(parse_bytes("3 parsecs").unwrap_err().contains("parsecs"));
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn formats_bytes_compactly() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.00 KiB");
        assert_eq!(format_bytes(20 << 20), "20.0 MiB");
        assert_eq!(format_bytes(1810 << 20), "1.77 GiB");
        assert_eq!(format_bytes(300 << 30), "300 GiB");
    }

    #[test]
    fn summary_fits_80_columns() {
        let mut s = MemoryStats::default();
        s.allocated_bytes.increase(Pool::Large, 123 << 30);
        s.allocation.increase(Pool::Large, 123_456_789);
        let text = s.summary();
        assert!(text.lines().count() > 30);
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "too wide: {line:?}");
            assert_eq!(line.chars().count(), 80, "misaligned: {line:?}");
        }
        assert!(text.contains("Allocated memory"));
        assert!(text.contains("123 GiB"));
    }

    /// The cells of the table row that starts with `label`.
    fn row<'t>(text: &'t str, label: &str) -> Vec<&'t str> {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("| {label} ")))
            .unwrap_or_else(|| panic!("no row {label:?} in\n{text}"));
        line.split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }

    #[test]
    fn a_current_only_row_prints_n_a_for_its_peak_and_totals() {
        let mut s = MemoryStats::default();
        s.inactive_split_bytes.increase(Pool::Small, 1 << 20);
        s.inactive_split.increase(Pool::Small, 1);
        s.allocated_bytes.increase(Pool::Large, 3 << 20);
        let recorded = Recorded::all().with_current_only(vec!["Non-releasable memory"]);
        let text = s.summary_recorded(&recorded);
        assert_eq!(
            row(&text, "Non-releasable memory"),
            ["Non-releasable memory", "1.00 MiB", "n/a", "n/a", "n/a"]
        );
        // Rows not named keep every figure.
        assert_eq!(
            row(&text, "Non-releasable allocs"),
            ["Non-releasable allocs", "1", "1", "1", "0"]
        );
        assert_eq!(
            row(&text, "Allocated memory"),
            [
                "Allocated memory",
                "3.00 MiB",
                "3.00 MiB",
                "3.00 MiB",
                "0 B"
            ]
        );
        let pools: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("| Non-releasable memory "))
            .skip(1)
            .take(2)
            .map(|l| {
                l.split('|')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        assert_eq!(
            pools,
            [
                vec!["from large pool", "0 B", "n/a", "n/a", "n/a"],
                vec!["from small pool", "1.00 MiB", "n/a", "n/a", "n/a"]
            ]
        );
    }
}

#[cfg(test)]
mod elide_tests {
    use super::{elide_end, elide_start};

    #[test]
    fn names_are_cut_to_the_characters_asked_for_and_kept_whole_within_them() {
        assert_eq!(elide_start("a/b/c.py", 8), "a/b/c.py");
        assert_eq!(elide_start("a/b/c.py", 5), "…c.py");
        assert_eq!(elide_end("forward_pass", 12), "forward_pass");
        assert_eq!(elide_end("forward_pass", 5), "forw…");
        // Characters, not bytes.
        assert_eq!(elide_start("ééééé", 3), "…éé");
        assert_eq!(elide_end("ééééé", 3), "éé…");
        assert_eq!(elide_start(&"x".repeat(100_000), 240).chars().count(), 240);
        assert_eq!(elide_end(&"x".repeat(100_000), 240).chars().count(), 240);
        assert_eq!(elide_start("abc", 0), "");
        assert_eq!(elide_end("abc", 0), "");
    }
}
