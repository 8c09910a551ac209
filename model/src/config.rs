//! Allocator settings: PyTorch's `PYTORCH_CUDA_ALLOC_CONF` options plus vramscope's own tracking
//! options, parsed from the same `key:value,key:value` syntax.
//!
//! The caching allocator (`vramscope_allocator::caching`) reads an [`AllocatorConfig`] once at
//! construction; snapshots (`crate::snapshot`) carry it so that a report knows the policy a trace
//! ran under. Parsing never panics: a bad key or value is a [`ConfigError`] that names it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The environment variable [`AllocatorConfig::from_env`] reads.
pub const CONFIG_ENV_VAR: &str = "VRAMSCOPE_ALLOC_CONF";

/// One MiB.
pub const MIB: u64 = 1024 * 1024;

/// Which placement policy the allocator follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// PyTorch's CUDA caching allocator, rule for rule.
    #[default]
    Pytorch,
    /// PyTorch's best fit over page-mapped segments that grow in place (one per stream and
    /// pool), whatever `expandable_segments` says: no 2 MiB or 20 MiB segment rounding, free
    /// tails unmapped by `empty_cache`. On the traces measured it reserves no more than
    /// PyTorch's expandable segments, whose 20 MiB pages can leave up to 20 MiB mapped and
    /// unused at a segment's end, and it makes more map calls (BENCHMARKS.md).
    Compact,
}

impl Policy {
    /// The policy's name in settings strings.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Pytorch => "pytorch",
            Policy::Compact => "compact",
        }
    }
}

/// How often a full backtrace is captured for an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BacktraceMode {
    /// Never: only the `#[track_caller]` location is kept.
    #[default]
    Off,
    /// One allocation in N (N ≥ 1) gets a backtrace.
    Sampled(u32),
    /// Every allocation gets a backtrace.
    All,
}

/// Settings of the caching allocator (`vramscope_allocator::CachingAllocator`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocatorConfig {
    /// Placement policy.
    #[serde(default)]
    pub policy: Policy,
    /// Blocks at least this large are never split for smaller requests (`max_split_size_mb`).
    /// `None` means unlimited, PyTorch's default.
    #[serde(default)]
    pub max_split_size: Option<u64>,
    /// Round requests up to one of this many divisions of each power of two (0: off).
    #[serde(default)]
    pub roundup_power2_divisions: u32,
    /// Free cached blocks when reserved memory passes this fraction of capacity (`None`: off).
    #[serde(default)]
    pub garbage_collection_threshold: Option<f64>,
    /// Grow segments by mapping pages into a reserved address range instead of new raw
    /// allocations.
    #[serde(default)]
    pub expandable_segments: bool,
    /// Record events into the ring (alloc, free, transfers, ...).
    #[serde(default = "default_true")]
    pub record_events: bool,
    /// Capture a `#[track_caller]` call site for each allocation.
    #[serde(default = "default_true")]
    pub record_sites: bool,
    /// Full backtrace capture.
    #[serde(default)]
    pub backtraces: BacktraceMode,
    /// Capacity of the event ring; the oldest events are overwritten and counted as dropped.
    #[serde(default = "default_max_entries")]
    pub max_entries: usize,
    /// Fill freed memory with a pattern and check it when the memory is handed out again
    /// (use-after-free detection; needs memory behind the addresses).
    #[serde(default)]
    pub debug: bool,
    /// Bytes of guard pattern after each block, checked when the block is freed (overflow
    /// detection; 0: off).
    #[serde(default)]
    pub guard_bytes: u64,
}

fn default_true() -> bool {
    true
}

fn default_max_entries() -> usize {
    1 << 20
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            policy: Policy::Pytorch,
            max_split_size: None,
            roundup_power2_divisions: 0,
            garbage_collection_threshold: None,
            expandable_segments: false,
            record_events: true,
            record_sites: true,
            backtraces: BacktraceMode::Off,
            max_entries: default_max_entries(),
            debug: false,
            guard_bytes: 0,
        }
    }
}

/// A configuration string that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key is not one vramscope knows.
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// An entry has no `:` between key and value.
    MissingValue {
        /// The entry as written.
        entry: String,
    },
    /// The value does not fit the key.
    BadValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What the key accepts.
        expected: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::UnknownKey { key } => write!(
                f,
                "unknown allocator setting `{key}` (known: max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, expandable_segments, policy, record_events, record_sites, backtraces, max_entries, debug, guard_bytes)"
            ),
            ConfigError::MissingValue { entry } => {
                write!(f, "allocator setting `{entry}` has no value (write key:value)")
            }
            ConfigError::BadValue {
                key,
                value,
                expected,
            } => write!(
                f,
                "bad value `{value}` for allocator setting `{key}`: expected {expected}"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(ConfigError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            expected: "True or False",
        }),
    }
}

impl AllocatorConfig {
    /// Parses `key:value,key:value` as `PYTORCH_CUDA_ALLOC_CONF` does, on top of the defaults.
    ///
    /// ```
    /// use vramscope_model::AllocatorConfig;
    /// let c = AllocatorConfig::parse("max_split_size_mb:128,expandable_segments:True").unwrap();
    /// assert_eq!(c.max_split_size, Some(128 << 20));
    /// assert!(c.expandable_segments);
    /// assert!(AllocatorConfig::parse("max_split_size_mb:4").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<AllocatorConfig, ConfigError> {
        let mut config = AllocatorConfig::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (key, value) = entry
                .split_once(':')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| ConfigError::MissingValue {
                    entry: entry.to_string(),
                })?;
            config.set(key, value)?;
        }
        Ok(config)
    }

    /// Applies one `key:value` setting.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let bad = |expected| ConfigError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            expected,
        };
        match key {
            "max_split_size_mb" => {
                let mb: u64 = value
                    .parse()
                    .map_err(|_| bad("a whole number of MiB, at least 20"))?;
                if mb < 20 {
                    return Err(bad("a whole number of MiB, at least 20"));
                }
                let bytes = mb
                    .checked_mul(MIB)
                    .ok_or_else(|| bad("a whole number of MiB, at least 20"))?;
                self.max_split_size = Some(bytes);
            }
            "roundup_power2_divisions" => {
                let divisions: u32 = value
                    .parse()
                    .map_err(|_| bad("a power of two between 1 and 64, or 0 for off"))?;
                if divisions != 0 && (!divisions.is_power_of_two() || divisions > 64) {
                    return Err(bad("a power of two between 1 and 64, or 0 for off"));
                }
                self.roundup_power2_divisions = divisions;
            }
            "garbage_collection_threshold" => {
                let threshold: f64 = value
                    .parse()
                    .map_err(|_| bad("a fraction strictly between 0.0 and 1.0"))?;
                if !(threshold > 0.0 && threshold < 1.0) {
                    return Err(bad("a fraction strictly between 0.0 and 1.0"));
                }
                self.garbage_collection_threshold = Some(threshold);
            }
            "expandable_segments" => self.expandable_segments = parse_bool(key, value)?,
            "policy" => {
                self.policy = match value {
                    "pytorch" => Policy::Pytorch,
                    "compact" => Policy::Compact,
                    _ => return Err(bad("pytorch or compact")),
                }
            }
            "record_events" => self.record_events = parse_bool(key, value)?,
            "record_sites" => self.record_sites = parse_bool(key, value)?,
            "backtraces" => {
                self.backtraces = match value {
                    "off" | "0" => BacktraceMode::Off,
                    "all" | "1" => BacktraceMode::All,
                    n => match n.parse::<u32>() {
                        Ok(n) if n > 1 => BacktraceMode::Sampled(n),
                        _ => return Err(bad("off, all, or N to sample one allocation in N")),
                    },
                }
            }
            "max_entries" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| bad("a whole number of events, at least 1"))?;
                if n == 0 {
                    return Err(bad("a whole number of events, at least 1"));
                }
                self.max_entries = n;
            }
            "debug" => self.debug = parse_bool(key, value)?,
            "guard_bytes" => {
                let n: u64 = value
                    .parse()
                    .map_err(|_| bad("a whole number of bytes up to 65536"))?;
                if n > 65536 {
                    return Err(bad("a whole number of bytes up to 65536"));
                }
                self.guard_bytes = n;
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    key: key.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Reads `VRAMSCOPE_ALLOC_CONF`; defaults when it is unset or empty.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        match std::env::var(CONFIG_ENV_VAR) {
            Ok(text) => AllocatorConfig::parse(&text),
            Err(_) => Ok(AllocatorConfig::default()),
        }
    }

    /// Whether segments are page-mapped and grow in place: `expandable_segments`, or the
    /// `compact` policy.
    pub fn uses_expandable_segments(&self) -> bool {
        self.expandable_segments || self.policy == Policy::Compact
    }

    /// Turns off every kind of tracking (events, call sites, backtraces): the fastest setting.
    pub fn untracked(mut self) -> AllocatorConfig {
        self.record_events = false;
        self.record_sites = false;
        self.backtraces = BacktraceMode::Off;
        self
    }
}

impl fmt::Display for AllocatorConfig {
    /// Writes the settings back in the `key:value,...` syntax `parse` reads, omitting the
    /// defaults (so the default settings print as an empty string).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.policy != Policy::default() {
            parts.push(format!("policy:{}", self.policy.name()));
        }
        if let Some(bytes) = self.max_split_size {
            parts.push(format!("max_split_size_mb:{}", bytes / MIB));
        }
        if self.roundup_power2_divisions > 0 {
            parts.push(format!(
                "roundup_power2_divisions:{}",
                self.roundup_power2_divisions
            ));
        }
        if let Some(t) = self.garbage_collection_threshold {
            parts.push(format!("garbage_collection_threshold:{t}"));
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".to_string());
        }
        match self.backtraces {
            BacktraceMode::Off => {}
            BacktraceMode::All => parts.push("backtraces:all".to_string()),
            BacktraceMode::Sampled(n) => parts.push(format!("backtraces:{n}")),
        }
        if !self.record_events {
            parts.push("record_events:False".to_string());
        }
        if !self.record_sites {
            parts.push("record_sites:False".to_string());
        }
        if self.max_entries != default_max_entries() {
            parts.push(format!("max_entries:{}", self.max_entries));
        }
        if self.debug {
            parts.push("debug:True".to_string());
        }
        if self.guard_bytes > 0 {
            parts.push(format!("guard_bytes:{}", self.guard_bytes));
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_pytorch() {
        let c = AllocatorConfig::parse("").unwrap();
        assert_eq!(c.max_split_size, None);
        assert_eq!(c.roundup_power2_divisions, 0);
        assert_eq!(c.garbage_collection_threshold, None);
        assert!(!c.expandable_segments);
    }

    #[test]
    fn parses_every_pytorch_key() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:256, roundup_power2_divisions:4,garbage_collection_threshold:0.6,expandable_segments:True",
        )
        .unwrap();
        assert_eq!(c.max_split_size, Some(256 * MIB));
        assert_eq!(c.roundup_power2_divisions, 4);
        assert_eq!(c.garbage_collection_threshold, Some(0.6));
        assert!(c.expandable_segments);
        assert_eq!(AllocatorConfig::parse(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn parses_tracking_keys() {
        let c = AllocatorConfig::parse("backtraces:64,max_entries:100,record_sites:False").unwrap();
        assert_eq!(c.backtraces, BacktraceMode::Sampled(64));
        assert_eq!(c.max_entries, 100);
        assert!(!c.record_sites);
        assert_eq!(
            AllocatorConfig::parse("backtraces:all").unwrap().backtraces,
            BacktraceMode::All
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let e = AllocatorConfig::parse("max_split_size:20").unwrap_err();
        assert_eq!(
            e,
            ConfigError::UnknownKey {
                key: "max_split_size".into()
            }
        );
        assert!(e.to_string().contains("`max_split_size`"));
    }

    #[test]
    fn bad_values_are_named() {
        for (text, key) in [
            ("max_split_size_mb:19", "max_split_size_mb"),
            ("max_split_size_mb:abc", "max_split_size_mb"),
            ("max_split_size_mb:99999999999999999", "max_split_size_mb"),
            ("roundup_power2_divisions:3", "roundup_power2_divisions"),
            ("roundup_power2_divisions:128", "roundup_power2_divisions"),
            (
                "garbage_collection_threshold:1.0",
                "garbage_collection_threshold",
            ),
            (
                "garbage_collection_threshold:0",
                "garbage_collection_threshold",
            ),
            (
                "garbage_collection_threshold:NaN",
                "garbage_collection_threshold",
            ),
            ("expandable_segments:yes", "expandable_segments"),
            ("policy:best", "policy"),
            ("backtraces:-1", "backtraces"),
            ("max_entries:0", "max_entries"),
        ] {
            match AllocatorConfig::parse(text) {
                Err(ConfigError::BadValue { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: expected a bad value error, got {other:?}"),
            }
        }
    }

    proptest::proptest! {
        // A fixed seed, as every property test of the workspace has (vramscope-testkit's
        // `props` module, which this crate cannot depend on).
        #![proptest_config(proptest::test_runner::Config { rng_seed: proptest::test_runner::RngSeed::Fixed(0x7672_616d_7363_6f70), ..proptest::test_runner::Config::default() })]
        /// Any text gives a configuration or an error that names the offending entry; never a
        /// panic. Configurations print back to text that parses to the same settings.
        #[test]
        fn arbitrary_text_parses_or_names_what_is_wrong(text in ".{0,80}") {
            match AllocatorConfig::parse(&text) {
                Ok(config) => {
                    proptest::prop_assert_eq!(AllocatorConfig::parse(&config.to_string()), Ok(config));
                }
                Err(e) => proptest::prop_assert!(!e.to_string().is_empty()),
            }
        }

        #[test]
        fn generated_settings_round_trip(
            mb in 20u64..100_000,
            divisions in 0u32..7,
            threshold in 1u32..99,
            expandable: bool,
        ) {
            let text = format!(
                "max_split_size_mb:{mb},roundup_power2_divisions:{},garbage_collection_threshold:0.{threshold:02},expandable_segments:{}",
                if divisions == 0 { 0 } else { 1u32 << (divisions - 1) },
                if expandable { "True" } else { "False" },
            );
            let config = AllocatorConfig::parse(&text).unwrap();
            proptest::prop_assert_eq!(config.max_split_size, Some(mb * MIB));
            proptest::prop_assert_eq!(AllocatorConfig::parse(&config.to_string()), Ok(config));
        }
    }

    #[test]
    fn tracking_settings_print_back_too() {
        // Found by the `config` fuzz target: `backtraces:2` did not survive printing.
        for text in [
            "backtraces:2",
            "backtraces:all",
            "record_events:False,record_sites:False",
            "max_entries:77,debug:True,guard_bytes:8,policy:compact",
        ] {
            let config = AllocatorConfig::parse(text).unwrap();
            assert_eq!(
                AllocatorConfig::parse(&config.to_string()),
                Ok(config),
                "{text}"
            );
        }
    }

    #[test]
    fn missing_value_is_an_error() {
        assert_eq!(
            AllocatorConfig::parse("expandable_segments").unwrap_err(),
            ConfigError::MissingValue {
                entry: "expandable_segments".into()
            }
        );
    }
}
