//! The one rule for why an allocation failed for good (out of memory), shared by the allocator's
//! own `OomReport` hint (`vramscope_allocator::caching`) and the inspector's `fragmentation` and
//! `oom` findings, so that a live program and a report on its snapshot never disagree about the
//! same failure.
//!
//! A caching allocator that cannot serve a request from its cache asks for more memory: a new
//! segment, or pages mapped into an expandable one. That fails for one of two reasons: the
//! process's own memory cap (PyTorch's `torch.cuda.set_per_process_memory_fraction`, vramscope's
//! `set_memory_limit`) would be passed, or the device has no room. Before it gives up, the
//! allocator releases every cached segment without live blocks (with expandable segments, every
//! whole free page) and tries again, so the reserved but unallocated memory left at the failure
//! is free pieces of segments (or pages) that live blocks share; PyTorch's allocator says so
//! beside its OOM message.
//!
//! [`diagnose`] takes what is known at the failure ([`OomFacts`]) and decides, in this order:
//!
//! 0. **Address space** ([`OomCause::AddressSpace`]): a new expandable segment could not
//!    reserve its address range (9/8 of the device's memory, one range per stream and pool),
//!    whatever memory was free: the device's address space ran out, not its memory.
//! 1. **The cap** ([`OomCause::Cap`]): the device had room for all the allocator would have
//!    asked of it ([`device_need`]), so the one limit left is the process's cap, known or not;
//!    or a known cap would have been passed by a new segment ([`cap_need`]), which the allocator
//!    checks before it asks the device.
//! 2. **The device refused memory it reported free** ([`OomCause::DeviceRefused`]): room on the
//!    device and under a known cap, and the request failed anyway (another process took the
//!    memory in between, or a simulated fault).
//! 3. **`max_split_size_mb`** ([`OomCause::SplitLimit`]): a cached free block the request could
//!    use (its stream and pool) was large enough, and the split limit is what kept it away.
//! 4. **Fragmentation** ([`OomCause::Fragmentation`]): the cache's free bytes alone would have
//!    covered the request, but not in one usable block, and the device had no room.
//! 5. **Memory in use** ([`OomCause::InUse`]): neither the cache nor the device had room.
//!
//! Each cause has a sentence of what happened ([`OomDiagnosis::explanation`]) and a fix
//! ([`OomDiagnosis::fix`]) that is true for it: raising the cap for the cap, the allocator
//! setting that returns cached pieces to the device for fragmentation (`expandable_segments:True`;
//! none when it is already on, since `max_split_size_mb` does not limit splitting in expandable
//! segments), and lowering the peak for memory in use.

use crate::pytorch::{segment_size_for, LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE};
use crate::{format_bytes, AllocatorConfig, Policy, SnapshotSource};

/// What is known when an allocation failed for good.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomFacts {
    /// The request after rounding (the block size asked for), in bytes.
    pub request: u64,
    /// Bytes allocated when it failed.
    pub allocated: u64,
    /// Bytes reserved when it failed, after the allocator's release-and-retry; `None` when the
    /// source does not record reserved memory.
    pub reserved: Option<u64>,
    /// The device's free memory when it failed, as the driver reported it.
    pub device_free: u64,
    /// The largest cached free block the request could have used (on its stream, in its pool),
    /// when known.
    pub largest_usable_free_block: Option<u64>,
    /// The process's memory cap (`set_per_process_memory_fraction` times the device's
    /// capacity, or `set_memory_limit`), when known. Without it, a cap is inferred when the
    /// device had room.
    pub cap: Option<u64>,
    /// Whether the device refused the address range of a new expandable segment during the
    /// failed allocation (only an allocator that saw it happen knows; a snapshot does not say).
    pub address_space_refused: bool,
}

impl OomFacts {
    /// Reserved but unallocated bytes (the cache's free memory), when reserved memory is known.
    pub fn reserved_unallocated(&self) -> Option<u64> {
        self.reserved.map(|r| r.saturating_sub(self.allocated))
    }
}

/// Why an allocation failed for good (see the [module documentation](self) for the order in
/// which the causes are tried).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OomCause {
    /// The device had no address range left for a new expandable segment, which reserves
    /// address space for 9/8 of the device's memory per stream and pool.
    AddressSpace,
    /// The process's memory cap refused the memory. `known` says whether the cap was given;
    /// when it was not, the device's free memory showed that nothing else could have refused.
    Cap {
        /// Whether the cap was known (else inferred).
        known: bool,
    },
    /// The device refused memory it reported free, under a known cap that left room.
    DeviceRefused,
    /// A cached free block on the request's stream and pool would have held it, but
    /// `max_split_size_mb` (`limit` bytes) keeps that block for other requests.
    SplitLimit {
        /// The split limit, in bytes.
        limit: u64,
    },
    /// The cache's free memory would have covered the request, but not in one block it could
    /// use, and the device had no room.
    Fragmentation,
    /// Neither the cache nor the device had room: the memory was in use.
    InUse,
}

impl OomCause {
    /// A stable id for the cause (`"memory_cap"`, `"fragmentation"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            OomCause::AddressSpace => "address_space",
            OomCause::Cap { .. } => "memory_cap",
            OomCause::DeviceRefused => "device_refused",
            OomCause::SplitLimit { .. } => "max_split_size",
            OomCause::Fragmentation => "fragmentation",
            OomCause::InUse => "memory_in_use",
        }
    }
}

/// How the program that failed names its settings, which a fix quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettingNames {
    /// The environment variable of the allocator's settings.
    pub env_var: &'static str,
    /// The call that caps the process's device memory.
    pub cap_call: &'static str,
}

impl SettingNames {
    /// PyTorch's names.
    pub const PYTORCH: SettingNames = SettingNames {
        env_var: "PYTORCH_CUDA_ALLOC_CONF",
        cap_call: "torch.cuda.set_per_process_memory_fraction",
    };
    /// vramscope's names.
    pub const VRAMSCOPE: SettingNames = SettingNames {
        env_var: crate::CONFIG_ENV_VAR,
        cap_call: "CachingAllocator::set_memory_limit",
    };

    /// The names of the program a snapshot from `source` came from.
    pub fn for_source(source: SnapshotSource) -> SettingNames {
        match source {
            SnapshotSource::Vramscope => SettingNames::VRAMSCOPE,
            SnapshotSource::Pytorch | SnapshotSource::ChromeTrace => SettingNames::PYTORCH,
        }
    }
}

/// The most device memory a request of `request` bytes (rounded) needs under `config`: its
/// plain segment, or, with page-mapped segments, the request rounded up to whole pages (less
/// when the segment's mapped free tail covers part of it, which a trace does not say).
pub fn device_need(config: &AllocatorConfig, request: u64) -> u64 {
    if config.uses_expandable_segments() {
        let page = if request <= SMALL_SIZE {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        request.div_ceil(page).saturating_mul(page).max(page)
    } else {
        segment_size_for(request)
    }
}

/// What a request of `request` bytes (rounded) adds to the reserved memory in the allocator's
/// check against its cap: the plain segment size under PyTorch's policy (PyTorch checks it
/// even for expandable segments), the request rounded to 2 MiB pages under the `compact`
/// policy, which maps only what it needs.
pub fn cap_need(config: &AllocatorConfig, request: u64) -> u64 {
    match config.policy {
        Policy::Pytorch => segment_size_for(request),
        Policy::Compact => request
            .div_ceil(SMALL_BUFFER)
            .saturating_mul(SMALL_BUFFER)
            .max(SMALL_BUFFER),
    }
}

/// The diagnosis of a failed allocation: its cause, and the facts and settings that word it.
#[derive(Clone, Debug, PartialEq)]
pub struct OomDiagnosis {
    /// Why it failed.
    pub cause: OomCause,
    /// What was known.
    pub facts: OomFacts,
    /// [`device_need`] for the request.
    pub device_need: u64,
    /// [`cap_need`] for the request.
    pub cap_need: u64,
    /// Whether segments were page-mapped (expandable segments or the `compact` policy).
    pub expandable: bool,
}

/// Diagnoses a failed allocation under `config` (see the [module documentation](self)).
pub fn diagnose(facts: &OomFacts, config: &AllocatorConfig) -> OomDiagnosis {
    let request = facts.request;
    let device_need = device_need(config, request);
    let cap_need = cap_need(config, request);
    let device_room = facts.device_free >= device_need;
    let cap_passed = match (facts.cap, facts.reserved) {
        (Some(cap), Some(reserved)) => Some(reserved.saturating_add(cap_need) > cap),
        _ => None,
    };
    let cached = facts.reserved_unallocated();
    let cause = if facts.address_space_refused {
        OomCause::AddressSpace
    } else if cap_passed == Some(true) {
        OomCause::Cap { known: true }
    } else if device_room {
        if cap_passed == Some(false) {
            OomCause::DeviceRefused
        } else {
            OomCause::Cap { known: false }
        }
    } else if let Some(limit) = split_limit_kept(config, facts) {
        OomCause::SplitLimit { limit }
    } else if cached.is_some_and(|c| c >= request) {
        OomCause::Fragmentation
    } else {
        OomCause::InUse
    };
    OomDiagnosis {
        cause,
        facts: *facts,
        device_need,
        cap_need,
        expandable: config.uses_expandable_segments(),
    }
}

/// The split limit, when a usable cached block large enough for the request was kept from it
/// by `max_split_size_mb`: a block of the limit or more is not given to a smaller request, and
/// a request of the limit or more takes no block [`LARGE_BUFFER`] or more larger than itself.
fn split_limit_kept(config: &AllocatorConfig, facts: &OomFacts) -> Option<u64> {
    let limit = config.max_split_size?;
    let block = facts.largest_usable_free_block?;
    let request = facts.request;
    let kept = block >= request
        && if request < limit {
            block >= limit
        } else {
            block >= request.saturating_add(LARGE_BUFFER)
        };
    kept.then_some(limit)
}

impl OomDiagnosis {
    /// Whether fragmentation explains the failure.
    pub fn is_fragmentation(&self) -> bool {
        self.cause == OomCause::Fragmentation
    }

    /// Reserved but unallocated bytes at the failure, when known.
    pub fn cached(&self) -> Option<u64> {
        self.facts.reserved_unallocated()
    }

    /// Whether the cache's free memory and the device's together would have covered the
    /// request, though neither alone did (memory in use that a page-mapped cache could have
    /// given back).
    pub fn covered_together(&self) -> bool {
        self.cause == OomCause::InUse
            && self.cached().is_some_and(|c| {
                c > 0 && c.saturating_add(self.facts.device_free) >= self.device_need
            })
    }

    /// What stopped the allocation, as a clause that follows "an allocation of N failed: ".
    pub fn explanation(&self) -> String {
        let f = &self.facts;
        let free = format_bytes(f.device_free);
        let device_short = if f.device_free >= f.request {
            format!(
                "the device had {free} free, less than {}",
                self.need_words()
            )
        } else {
            format!("the device had only {free} free")
        };
        match self.cause {
            OomCause::AddressSpace => format!(
                "a new expandable segment could not reserve its address range although the device had {free} free: every stream and pool that allocates reserves address space for 9/8 of the device's memory, and the device's address space ran out"
            ),
            OomCause::Cap { known: true } => {
                let device = if f.device_free >= self.device_need {
                    format!("; the device had {free} free, room for it")
                } else {
                    format!("; {device_short} as well")
                };
                format!(
                    "{} reserved and the {} more it needed pass the process's memory cap of {}{device}{}",
                    format_bytes(f.reserved.unwrap_or(0)),
                    format_bytes(self.cap_need),
                    format_bytes(f.cap.unwrap_or(0)),
                    self.cache_clause()
                )
            }
            OomCause::Cap { known: false } => format!(
                "the device had {free} free, room for {}, so the limit was the process's own memory cap{}{}",
                self.need_words(),
                match f.reserved {
                    Some(r) => format!(" ({} reserved)", format_bytes(r)),
                    None => String::new(),
                },
                self.cache_clause()
            ),
            OomCause::DeviceRefused => format!(
                "the device refused {} although it reported {free} free and the process's memory cap of {} left room (another process may have taken the memory in between)",
                format_bytes(self.device_need),
                format_bytes(f.cap.unwrap_or(0))
            ),
            OomCause::SplitLimit { limit } => {
                let block = format_bytes(f.largest_usable_free_block.unwrap_or(0));
                let rule = if f.request < limit {
                    format!("keeps blocks of {} or more for requests that large", format_bytes(limit))
                } else {
                    format!(
                        "gives a request of {} or more no block {} or more larger than itself",
                        format_bytes(limit),
                        format_bytes(LARGE_BUFFER)
                    )
                };
                format!(
                    "a cached free block of {block} on its stream would have held it, but max_split_size_mb:{} {rule}, and {device_short}",
                    limit >> 20
                )
            }
            OomCause::Fragmentation => format!(
                "{} was reserved but unallocated, enough for it, but {}, and {device_short}",
                format_bytes(self.cached().unwrap_or(0)),
                self.pieces()
            ),
            OomCause::InUse => match self.cached() {
                Some(cached) if self.covered_together() => format!(
                    "{} reserved but unallocated and {free} free on the device would have covered it together but neither did alone: the cached pieces cannot go back to the device while live blocks share their {}",
                    format_bytes(cached),
                    if self.expandable { "pages" } else { "segments" }
                ),
                Some(0) => format!(
                    "{} was allocated, nothing was cached, and {device_short}",
                    format_bytes(f.allocated)
                ),
                Some(cached) => format!(
                    "{} was allocated and {} reserved but unallocated, less than it needed, and {device_short}",
                    format_bytes(f.allocated),
                    format_bytes(cached)
                ),
                None => format!(
                    "{} was allocated and {device_short}",
                    format_bytes(f.allocated)
                ),
            },
        }
    }

    /// What the allocator needed of the device, in words.
    fn need_words(&self) -> String {
        let need = format_bytes(self.device_need);
        if self.expandable {
            format!("the {need} of pages it needed at most")
        } else {
            format!("the {need} segment it needed")
        }
    }

    /// The cache's free memory as the request saw it: in pieces, the largest usable one named
    /// when known (a larger one that the failure contradicts is not named).
    fn pieces(&self) -> String {
        match self.facts.largest_usable_free_block {
            Some(largest) if largest < self.facts.request => format!(
                "in pieces, the largest it could use {}",
                format_bytes(largest)
            ),
            _ => "not in a block the allocator could give it".to_string(),
        }
    }

    /// Under a cap, what the cache held, when that is worth saying: free pieces that together
    /// would have covered the request.
    fn cache_clause(&self) -> String {
        match self.cached() {
            Some(cached) if cached >= self.facts.request => format!(
                "; {} of the reserved memory was unallocated, {}",
                format_bytes(cached),
                self.pieces()
            ),
            _ => String::new(),
        }
    }

    /// The allocator setting (in `PYTORCH_CUDA_ALLOC_CONF` syntax) that helps against this
    /// failure, if one does: `expandable_segments:True` when the cache's free pieces are the
    /// problem and segments are not page-mapped yet. With expandable segments on, whole free
    /// pages already go back to the device before the allocator gives up, and
    /// `max_split_size_mb` does not limit splitting there, so no setting is named.
    pub fn setting(&self) -> Option<String> {
        let pieces_matter = match self.cause {
            OomCause::Fragmentation => true,
            OomCause::Cap { .. } => self.cached().is_some_and(|c| c >= self.facts.request),
            OomCause::InUse => self.covered_together(),
            OomCause::AddressSpace | OomCause::DeviceRefused | OomCause::SplitLimit { .. } => false,
        };
        (pieces_matter && !self.expandable).then(|| "expandable_segments:True".to_string())
    }

    /// The fix, one line, naming the settings as `names` does.
    pub fn fix(&self, names: SettingNames) -> String {
        let var = names.env_var;
        let lower_peak =
            "lower the peak: smaller batch, activation checkpointing or lower precision";
        let setting = self.setting();
        match self.cause {
            OomCause::AddressSpace => format!(
                "allocate on fewer streams (each stream and pool reserves its own range), or set {var}=expandable_segments:False"
            ),
            OomCause::Cap { .. } => {
                let mut fix = format!(
                    "raise or remove the process's memory cap ({}), or {lower_peak}",
                    names.cap_call
                );
                if let Some(s) = setting {
                    fix.push_str(&format!(
                        "; {var}={s} also lets the free pages of the cached pieces be mapped where a request needs them"
                    ));
                }
                fix
            }
            OomCause::DeviceRefused => format!(
                "find what else takes memory on the device (another process, or an injected fault) and leave it room, or {lower_peak}"
            ),
            OomCause::SplitLimit { limit } => format!(
                "raise or remove max_split_size_mb (now {}) in {var}, so that cached blocks of {} or more can serve this request",
                limit >> 20,
                format_bytes(limit)
            ),
            OomCause::Fragmentation => match setting {
                Some(s) => format!(
                    "set {var}={s}: segments then grow by mapping pages, and before an allocation fails the allocator unmaps the whole free pages of partly used segments, to map them where the request needs them"
                ),
                None => format!(
                    "segments are already expandable, so only parts of pages that live blocks share stay cached: {lower_peak}, or allocate long-lived tensors before the loop so that short-lived ones do not sit between them"
                ),
            },
            OomCause::InUse => match setting {
                Some(s) => format!(
                    "{lower_peak}; or set {var}={s}, which returns the whole free pages of partly used segments to the device before an allocation fails"
                ),
                None => format!("{lower_peak}; free what the largest holders keep"),
            },
        }
    }

    /// The allocator's hint for its OOM message: why and what to do, or `None` when the
    /// memory was simply in use (the message's figures already say so).
    pub fn hint(&self, names: SettingNames) -> Option<String> {
        if self.cause == OomCause::InUse && !self.covered_together() {
            return None;
        }
        Some(format!(
            "Why: {}. Fix: {}.",
            self.explanation(),
            self.fix(names)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MIB;

    const GIB: u64 = 1 << 30;

    fn plain() -> AllocatorConfig {
        AllocatorConfig::default()
    }

    fn expandable() -> AllocatorConfig {
        AllocatorConfig {
            expandable_segments: true,
            ..AllocatorConfig::default()
        }
    }

    /// A failure of `request` with `cached` reserved but unallocated (`allocated` fixed at
    /// 1 GiB) and `device_free` free.
    fn facts(request: u64, cached: u64, device_free: u64) -> OomFacts {
        OomFacts {
            request,
            allocated: GIB,
            reserved: Some(GIB + cached),
            device_free,
            largest_usable_free_block: None,
            cap: None,
            address_space_refused: false,
        }
    }

    #[test]
    fn segment_and_page_needs_follow_pytorch() {
        assert_eq!(device_need(&plain(), 128 * MIB), 128 * MIB);
        assert_eq!(device_need(&expandable(), 128 * MIB), 140 * MIB);
        assert_eq!(device_need(&expandable(), 512), 2 * MIB);
        assert_eq!(cap_need(&expandable(), 128 * MIB), 128 * MIB);
        let compact = AllocatorConfig {
            policy: Policy::Compact,
            ..AllocatorConfig::default()
        };
        assert_eq!(cap_need(&compact, 3 * MIB), 4 * MIB);
    }

    /// An expandable segment whose address range the device refused names the address space,
    /// not a cap the device's free memory would otherwise suggest, and no allocator setting
    /// but the one that stops the reservations.
    #[test]
    fn a_refused_address_range_is_the_address_space() {
        let mut f = facts(128 * MIB, 0, 1 << 50);
        assert_eq!(
            diagnose(&f, &expandable()).cause,
            OomCause::Cap { known: false }
        );
        f.address_space_refused = true;
        let d = diagnose(&f, &expandable());
        assert_eq!(d.cause, OomCause::AddressSpace);
        assert_eq!(d.cause.as_str(), "address_space");
        let text = d.explanation();
        assert!(text.contains("address range"), "{text}");
        assert!(text.contains("1.00 PiB free"), "{text}");
        assert!(!text.contains("cap"), "{text}");
        assert_eq!(d.setting(), None);
        let fix = d.fix(SettingNames::PYTORCH);
        assert!(fix.contains("fewer streams"), "{fix}");
        assert!(
            fix.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"),
            "{fix}"
        );
        let hint = d.hint(SettingNames::VRAMSCOPE).unwrap();
        assert!(hint.starts_with("Why: a new expandable segment"), "{hint}");
    }

    /// The audit's case: a capped PyTorch run with expandable segments, 43.8 MiB cached and
    /// 138 GiB free on the device, failed on a 128 MiB request.
    #[test]
    fn room_on_the_device_is_the_cap_not_fragmentation() {
        let f = facts(128 * MIB, 45_943_808, 147_793_772_544);
        let d = diagnose(&f, &expandable());
        assert_eq!(d.cause, OomCause::Cap { known: false });
        assert!(!d.is_fragmentation());
        let text = d.explanation();
        assert!(text.contains("138 GiB free"), "{text}");
        assert!(text.contains("memory cap"), "{text}");
        assert!(!text.contains("pieces"), "{text}");
        assert_eq!(d.setting(), None);
        let fix = d.fix(SettingNames::PYTORCH);
        assert!(
            fix.contains("torch.cuda.set_per_process_memory_fraction"),
            "{fix}"
        );
        assert!(!fix.contains("max_split_size_mb"), "{fix}");
        // Plain segments, nothing cached: the same.
        let d = diagnose(&facts(128 * MIB, 0, 10 * GIB), &plain());
        assert_eq!(d.cause, OomCause::Cap { known: false });
        // Room on the device and a cache that would have covered it: still the cap, with the
        // pieces named and the setting that frees them offered beside raising the cap.
        let d = diagnose(&facts(100 * MIB, 300 * MIB, 10 * GIB), &plain());
        assert_eq!(d.cause, OomCause::Cap { known: false });
        assert!(d
            .explanation()
            .contains("300 MiB of the reserved memory was unallocated"));
        let fix = d.fix(SettingNames::PYTORCH);
        assert!(fix.starts_with("raise or remove"), "{fix}");
        assert!(fix.contains("expandable_segments:True"), "{fix}");
    }

    #[test]
    fn a_known_cap_is_checked_against_a_plain_segment_first() {
        // 1.04 GiB reserved + 128 MiB passes a cap of 1.10 GiB, whatever the device has.
        let mut f = facts(128 * MIB, 40 * MIB, 0);
        f.cap = Some(GIB + 100 * MIB);
        let d = diagnose(&f, &expandable());
        assert_eq!(d.cause, OomCause::Cap { known: true });
        let text = d.explanation();
        assert!(text.contains("1.04 GiB reserved and the 128 MiB more it needed pass the process's memory cap of 1.10 GiB"), "{text}");
        assert!(text.contains("only 0 B free as well"), "{text}");
        assert!(d
            .fix(SettingNames::VRAMSCOPE)
            .contains("CachingAllocator::set_memory_limit"));
        // Under the cap with room on the device: the device refused what it reported free.
        f.cap = Some(10 * GIB);
        f.device_free = 10 * GIB;
        assert_eq!(diagnose(&f, &expandable()).cause, OomCause::DeviceRefused);
        // Under the cap, the device full, 40 MiB cached: memory in use.
        f.device_free = 0;
        assert_eq!(diagnose(&f, &expandable()).cause, OomCause::InUse);
    }

    #[test]
    fn cache_that_covers_the_request_on_a_full_device_is_fragmentation() {
        let mut f = facts(100 * MIB, 80 * MIB + 30 * MIB, 30 * MIB);
        let d = diagnose(&f, &plain());
        assert_eq!(d.cause, OomCause::Fragmentation);
        assert!(d.is_fragmentation());
        let text = d.explanation();
        assert!(
            text.contains("110 MiB was reserved but unallocated"),
            "{text}"
        );
        assert!(
            text.contains("not in a block the allocator could give it"),
            "{text}"
        );
        assert!(text.contains("only 30.0 MiB free"), "{text}");
        assert_eq!(d.setting().as_deref(), Some("expandable_segments:True"));
        // The largest usable piece, when known, is named.
        f.largest_usable_free_block = Some(18 * MIB);
        let text = diagnose(&f, &plain()).explanation();
        assert!(text.contains("the largest it could use 18.0 MiB"), "{text}");
        // With expandable segments on, no setting is offered, and max_split_size_mb least of
        // all: it does not limit splitting there.
        let d = diagnose(&f, &expandable());
        assert_eq!(d.cause, OomCause::Fragmentation);
        assert_eq!(d.setting(), None);
        let fix = d.fix(SettingNames::PYTORCH);
        assert!(!fix.contains("max_split_size_mb"), "{fix}");
        assert!(fix.contains("lower the peak"), "{fix}");
    }

    #[test]
    fn device_room_for_the_request_but_not_its_segment_is_not_the_cap() {
        // 5 MiB asks for a 20 MiB segment; 10 MiB free is not enough.
        let d = diagnose(&facts(5 * MIB, 0, 10 * MIB), &plain());
        assert_eq!(d.cause, OomCause::InUse);
        assert_eq!(
            d.explanation(),
            "1.00 GiB was allocated, nothing was cached, and the device had 10.0 MiB free, less than the 20.0 MiB segment it needed"
        );
        let d = diagnose(&facts(5 * MIB, 6 * MIB, 10 * MIB), &plain());
        assert_eq!(d.cause, OomCause::Fragmentation);
        assert!(d
            .explanation()
            .contains("less than the 20.0 MiB segment it needed"));
    }

    #[test]
    fn memory_in_use_is_not_fragmentation() {
        // Little cached, little free.
        let d = diagnose(&facts(100 * MIB, 20 * MIB, 10 * MIB), &plain());
        assert_eq!(d.cause, OomCause::InUse);
        assert_eq!(
            d.explanation(),
            "1.00 GiB was allocated and 20.0 MiB reserved but unallocated, less than it needed, and the device had only 10.0 MiB free"
        );
        assert_eq!(d.setting(), None);
        assert!(d.hint(SettingNames::VRAMSCOPE).is_none());
        // Cache and device together would have covered it, neither alone.
        let d = diagnose(&facts(100 * MIB, 80 * MIB, 30 * MIB), &plain());
        assert_eq!(d.cause, OomCause::InUse);
        assert!(d.covered_together());
        let text = d.explanation();
        assert!(text.contains("neither did alone"), "{text}");
        assert!(text.contains("share their segments"), "{text}");
        assert_eq!(d.setting().as_deref(), Some("expandable_segments:True"));
        assert!(d.hint(SettingNames::VRAMSCOPE).is_some());
        // The same with expandable segments on: no setting, pages named.
        let d = diagnose(&facts(100 * MIB, 80 * MIB, 30 * MIB), &expandable());
        assert!(d.explanation().contains("share their pages"));
        assert_eq!(d.setting(), None);
        // Reserved memory unknown (a profiler trace): memory in use, worded without it.
        let mut f = facts(100 * MIB, 0, 10 * MIB);
        f.reserved = None;
        let d = diagnose(&f, &plain());
        assert_eq!(d.cause, OomCause::InUse);
        assert_eq!(
            d.explanation(),
            "1.00 GiB was allocated and the device had only 10.0 MiB free"
        );
    }

    #[test]
    fn a_usable_block_kept_by_the_split_limit_is_the_split_limit() {
        let config = AllocatorConfig {
            max_split_size: Some(64 * MIB),
            ..AllocatorConfig::default()
        };
        // A 200 MiB free block is oversize for a 30 MiB request.
        let mut f = facts(30 * MIB, 250 * MIB, 0);
        f.largest_usable_free_block = Some(200 * MIB);
        let d = diagnose(&f, &config);
        assert_eq!(d.cause, OomCause::SplitLimit { limit: 64 * MIB });
        assert!(d
            .explanation()
            .contains("max_split_size_mb:64 keeps blocks"));
        assert!(d.fix(SettingNames::PYTORCH).contains("max_split_size_mb"));
        // A 100 MiB request may take a block up to 20 MiB larger, not 200 MiB.
        f.request = 100 * MIB;
        assert_eq!(
            diagnose(&f, &config).cause,
            OomCause::SplitLimit { limit: 64 * MIB }
        );
        // A 190 MiB request may take it: the block does not explain the failure, and the
        // cache covered the request, so fragmentation is what is left.
        f.request = 190 * MIB;
        assert_eq!(diagnose(&f, &config).cause, OomCause::Fragmentation);
        // Without a split limit a large usable block explains nothing either, and it is not
        // named as the largest piece.
        f.request = 30 * MIB;
        let d = diagnose(&f, &plain());
        assert_eq!(d.cause, OomCause::Fragmentation);
        assert!(!d.explanation().contains("200 MiB"), "{}", d.explanation());
    }

    #[test]
    fn names_follow_the_source() {
        assert_eq!(
            SettingNames::for_source(SnapshotSource::Pytorch).env_var,
            "PYTORCH_CUDA_ALLOC_CONF"
        );
        assert_eq!(
            SettingNames::for_source(SnapshotSource::Vramscope).env_var,
            "VRAMSCOPE_ALLOC_CONF"
        );
        assert_eq!(OomCause::Cap { known: false }.as_str(), "memory_cap");
    }
}
