//! What a caller of the replay asks for (`vramscope replay`'s flags), settled into one value
//! before a trace is read, and what running it on one device's trace comes to.
//!
//! [`ReplayPlan::new`] reads the settings once: those given in `PYTORCH_CUDA_ALLOC_CONF`
//! syntax, else the trace's own ([`trace_settings`]), with a placement policy given in place of
//! either's. [`ReplayPlan::run`] then makes the choices every replay of the command makes: the
//! start state reconstructed, and without a capacity the one the trace implies
//! ([`ReplayOptions::infer_capacity`]), since a trace that ran under pressure should be
//! replayed on what it had, not on an unlimited device; a sweep tries the settings given as one
//! more row. The [`ReplayOutcome`] says whether the command fails
//! ([`ReplayOutcome::fails`]: a verification that found a difference, or an OOM asked to
//! fail), renders as text and serializes as the JSON document of its kind; the caller only
//! prints it.

use serde::{Serialize, Serializer};
use vramscope_model::{AllocatorConfig, ConfigError, Policy, Snapshot};

use super::{
    render_sweep_text, render_text, replay, sweep_with, trace_settings, DeviceCallCheck,
    ReplayOptions, ReplayResult, SweepRow, UNLIMITED_CAPACITY,
};

/// What a replay is asked for, as a command line gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayRequest {
    /// The device's capacity; `None` for the one the trace implies, else unlimited.
    pub capacity: Option<u64>,
    /// Allocator settings in `PYTORCH_CUDA_ALLOC_CONF` syntax; `None` for the trace's own
    /// (`Some("")` for PyTorch's defaults).
    pub conf: Option<String>,
    /// A placement policy's name (`pytorch`, `compact`) in place of the settings' own.
    pub policy: Option<String>,
    /// Try a set of settings ([`super::sweep_with`]) instead of replaying once.
    pub sweep: bool,
    /// Compare the replay's device calls with the trace's ([`ReplayOptions::verify`]).
    pub verify: bool,
    /// Fail when the replay runs out of memory, or its start state alone exceeds the capacity.
    pub fail_on_oom: bool,
}

/// A [`ReplayRequest`] with its settings read: ready to run on each device's trace.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayPlan {
    request: ReplayRequest,
    /// The settings given (PyTorch's defaults without `conf`), the policy given included.
    config: AllocatorConfig,
    /// The policy given, as read.
    policy: Option<Policy>,
}

impl ReplayPlan {
    /// Reads the settings of `request`; an error names a setting or a value that is not one.
    pub fn new(request: ReplayRequest) -> Result<ReplayPlan, ConfigError> {
        let mut config = AllocatorConfig::parse(request.conf.as_deref().unwrap_or(""))?;
        if let Some(policy) = &request.policy {
            config.set("policy", policy)?;
        }
        let policy = request.policy.as_ref().map(|_| config.policy);
        Ok(ReplayPlan {
            request,
            config,
            policy,
        })
    }

    /// Whether the plan sweeps a set of settings rather than replaying once.
    pub fn sweeps(&self) -> bool {
        self.request.sweep
    }

    /// Replays `snapshot` (one device's trace) as planned; `progress` is called now and then
    /// with (work done, work in all).
    pub fn run(
        &self,
        snapshot: &Snapshot,
        progress: &mut dyn FnMut(usize, usize),
    ) -> ReplayOutcome {
        let capacity = self.request.capacity;
        if self.request.sweep {
            // The settings given are one more row: `conf`'s, or the trace's with the policy.
            let given = match (&self.request.conf, self.policy) {
                (Some(_), _) => Some(self.config.clone()),
                (None, Some(policy)) => {
                    let mut given = trace_settings(snapshot);
                    given.policy = policy;
                    Some(given)
                }
                (None, None) => None,
            };
            let rows = sweep_with(snapshot, capacity, given.as_ref(), progress);
            return ReplayOutcome::Sweep {
                capacity: capacity.unwrap_or(UNLIMITED_CAPACITY),
                rows,
            };
        }
        let options = ReplayOptions {
            capacity,
            config: self.config.clone(),
            trace_settings: self.request.conf.is_none(),
            policy: self.policy,
            reconstruct_start: true,
            verify: self.request.verify,
            // A trace that ran under pressure says what it had: replay on that, not on an
            // unlimited device.
            infer_capacity: true,
        };
        let result = replay(snapshot, &options, progress);
        let fails = result
            .device_calls
            .as_ref()
            .is_some_and(DeviceCallCheck::differs)
            || (self.request.fail_on_oom
                && (result.first_oom.is_some() || result.start_over_capacity.is_some()));
        ReplayOutcome::Replay {
            result: Box::new(result),
            fails,
        }
    }
}

/// What a [`ReplayPlan`] found on one device's trace. It serializes as the JSON document of
/// its kind: a sweep's rows, or the replay's result.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplayOutcome {
    /// A sweep of settings against `capacity` (the one given, else [`UNLIMITED_CAPACITY`]),
    /// best fit first.
    Sweep {
        /// The capacity the settings were tried against.
        capacity: u64,
        /// One row per setting tried.
        rows: Vec<SweepRow>,
    },
    /// One replay.
    Replay {
        /// What it found (boxed: a result is several hundred bytes, a sweep's rows a `Vec`).
        result: Box<ReplayResult>,
        /// Whether the request fails on it: its device calls differ from the trace's, or it
        /// ran out of memory (or its start state alone exceeds the capacity) with
        /// [`ReplayRequest::fail_on_oom`].
        fails: bool,
    },
}

impl ReplayOutcome {
    /// Whether the request fails on this outcome (exit status 1 for the command line); a
    /// sweep never does.
    pub fn fails(&self) -> bool {
        matches!(self, ReplayOutcome::Replay { fails: true, .. })
    }

    /// The outcome as text, naming the trace as `source`.
    pub fn render_text(&self, source: &str) -> String {
        match self {
            ReplayOutcome::Sweep { capacity, rows } => render_sweep_text(source, *capacity, rows),
            ReplayOutcome::Replay { result, .. } => render_text(source, result),
        }
    }
}

impl Serialize for ReplayOutcome {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ReplayOutcome::Sweep { rows, .. } => rows.serialize(serializer),
            ReplayOutcome::Replay { result, .. } => result.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_is_not_one_is_refused_before_any_trace() {
        let request = ReplayRequest {
            conf: Some("no_such_setting:1".to_string()),
            ..ReplayRequest::default()
        };
        assert!(ReplayPlan::new(request).is_err());
        let request = ReplayRequest {
            policy: Some("sideways".to_string()),
            ..ReplayRequest::default()
        };
        assert!(ReplayPlan::new(request).is_err());
    }

    #[test]
    fn the_policy_given_replaces_the_settings_own() {
        let request = ReplayRequest {
            conf: Some(String::new()),
            policy: Some("compact".to_string()),
            ..ReplayRequest::default()
        };
        let plan = ReplayPlan::new(request).unwrap();
        assert_eq!(plan.policy, Some(Policy::Compact));
        assert_eq!(plan.config.policy, Policy::Compact);
        assert!(!plan.sweeps());
    }

    /// A run that allocates 100 MiB and then 30, 3 and 50 MiB a step, traced.
    fn traced_run() -> Snapshot {
        let alloc = vramscope_caching::CachingAllocator::new(
            vramscope_caching::SimDevice::phantom(1 << 40),
            AllocatorConfig::default(),
        );
        let _weights = alloc.alloc(100 << 20).unwrap();
        for _ in 0..3 {
            alloc.mark_step();
            let _a = alloc.alloc(30 << 20).unwrap();
        }
        alloc.snapshot()
    }

    fn outcome(capacity: Option<u64>, fail_on_oom: bool, sweep: bool) -> ReplayOutcome {
        let request = ReplayRequest {
            capacity,
            fail_on_oom,
            sweep,
            ..ReplayRequest::default()
        };
        ReplayPlan::new(request)
            .unwrap()
            .run(&traced_run(), &mut |_, _| {})
    }

    #[test]
    fn an_oom_fails_the_request_only_when_asked_to() {
        let small = Some(64 << 20);
        assert!(outcome(small, true, false).fails());
        assert!(!outcome(small, false, false).fails());
        assert!(!outcome(None, true, false).fails());
    }

    #[test]
    fn a_sweep_never_fails_and_says_its_capacity() {
        match outcome(Some(64 << 20), false, true) {
            ReplayOutcome::Sweep { capacity, rows } => {
                assert_eq!(capacity, 64 << 20);
                assert!(!rows.is_empty());
            }
            other => panic!("a sweep came back as {other:?}"),
        }
        assert!(!outcome(Some(64 << 20), false, true).fails());
        match outcome(None, false, true) {
            ReplayOutcome::Sweep { capacity, .. } => assert_eq!(capacity, UNLIMITED_CAPACITY),
            other => panic!("a sweep came back as {other:?}"),
        }
    }
}
