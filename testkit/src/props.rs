//! The one configuration of every property test: deterministic by default, deep on request.
//!
//! A property test that draws new cases on every run fails by chance on a fresh clone and
//! passes when run again, which blocks a landing for nothing and hides the case. So every
//! `proptest!` block of the workspace takes its configuration from [`config`]: a fixed seed
//! ([`SEED`]), so `cargo test --workspace` runs the same cases every time, and the regressions
//! proptest persists beside each test file run first. A deeper search is one explicit command
//! that CI does not time:
//!
//! ```sh
//! VRAMSCOPE_PROPTEST_DEEP=5000 cargo test --workspace   # 5,000 cases each, a random seed
//! ```
//!
//! `PROPTEST_RNG_SEED=N` replays the cases of another seed (proptest prints the seed of a
//! failing run), and `PROPTEST_CASES=N` changes the count without changing the seed.

use proptest::test_runner::{Config, RngSeed};

/// The seed of every property test in an ordinary run.
pub const SEED: u64 = 0x7672_616d_7363_6f70;

/// The environment variable that asks for a deep run: its value is the number of cases each
/// property test draws, from a random seed.
pub const DEEP_ENV: &str = "VRAMSCOPE_PROPTEST_DEEP";

/// The configuration of a property test that draws `cases` cases in an ordinary run: the
/// fixed [`SEED`] unless `PROPTEST_RNG_SEED` names another; with [`DEEP_ENV`] set, that many
/// cases from a random seed.
pub fn config(cases: u32) -> Config {
    // `with_cases` starts from proptest's defaults, which read the `PROPTEST_*` variables.
    let mut config = Config::with_cases(cases);
    let deep = std::env::var(DEEP_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|&n| n > 0);
    match deep {
        Some(n) => config.cases = n,
        None if std::env::var_os("PROPTEST_RNG_SEED").is_none() => {
            config.rng_seed = RngSeed::Fixed(SEED);
        }
        None => {}
    }
    if std::env::var_os("PROPTEST_CASES").is_some() && deep.is_none() {
        config.cases = Config::default().cases;
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_run_has_a_fixed_seed() {
        if std::env::var_os(DEEP_ENV).is_some() || std::env::var_os("PROPTEST_RNG_SEED").is_some() {
            return;
        }
        let c = config(17);
        assert_eq!(c.rng_seed, RngSeed::Fixed(SEED));
        if std::env::var_os("PROPTEST_CASES").is_none() {
            assert_eq!(c.cases, 17);
        }
    }
}
