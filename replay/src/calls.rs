//! The device calls of a trace and of its replay, compared call for call: PyTorch's
//! `segment_alloc`/`segment_free` (and the expandable segments' maps and unmaps) as the trace
//! records them, against those the replay's allocator made ([`DeviceCallCheck`]).

use super::*;

/// One device call: a segment allocation, free, map or unmap, by its action name
/// (`segment_alloc`, ...) and size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceCall {
    /// PyTorch's action name.
    pub action: &'static str,
    /// Bytes.
    pub size: u64,
}

/// The first place where the replay's device calls and the trace's part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallDifference {
    /// Position of the call among the device calls, from 0.
    pub index: u64,
    /// The trace's event sequence number there, if the trace has a call there.
    pub trace_seq: Option<u64>,
    /// What the trace did there (none when the replay made more calls).
    pub trace: Option<DeviceCall>,
    /// What the replay did there (none when the trace made more calls).
    pub replay: Option<DeviceCall>,
}

/// How the replay's device calls compare with the trace's: whether the replay is the trace's
/// allocator, call for call, and where it stops being so. A trace that records no device
/// calls has nothing to compare with: see [`DeviceCallCheck::differs`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceCallCheck {
    /// Device calls in the trace.
    pub trace_calls: u64,
    /// Device calls the replay made.
    pub replay_calls: u64,
    /// Calls equal in action and size, in order, before the first difference.
    pub matching: u64,
    /// The first difference, if any.
    pub first_difference: Option<CallDifference>,
}

impl DeviceCallCheck {
    /// Whether the replay's device calls differ from the trace's. A trace that records none
    /// (a format without segment events) has nothing to differ from: `false`, whatever calls
    /// the replay made.
    pub fn differs(&self) -> bool {
        self.trace_calls > 0 && self.first_difference.is_some()
    }
}

/// The device calls among `events`, with their sequence numbers.
pub(crate) fn device_calls<'a>(
    events: impl Iterator<Item = &'a vramscope_model::Event>,
) -> Vec<(u64, DeviceCall)> {
    events.filter_map(device_call).collect()
}

/// The device call event `e` records, with its sequence number, if it records one.
pub(crate) fn device_call(e: &vramscope_model::Event) -> Option<(u64, DeviceCall)> {
    matches!(
        e.kind,
        EventKind::SegmentAlloc
            | EventKind::SegmentFree
            | EventKind::SegmentMap
            | EventKind::SegmentUnmap
    )
    .then(|| {
        (
            e.seq,
            DeviceCall {
                action: e.kind.name(),
                size: e.size,
            },
        )
    })
}

/// Compares two runs' device calls, call by call.
pub(crate) fn compare_calls(
    trace: &[(u64, DeviceCall)],
    replay: &[(u64, DeviceCall)],
) -> DeviceCallCheck {
    let matching = trace
        .iter()
        .zip(replay)
        .take_while(|((_, a), (_, b))| a == b)
        .count();
    let first_difference = (matching < trace.len().max(replay.len())).then(|| CallDifference {
        index: matching as u64,
        trace_seq: trace.get(matching).map(|(seq, _)| *seq),
        trace: trace.get(matching).map(|(_, call)| call.clone()),
        replay: replay.get(matching).map(|(_, call)| call.clone()),
    });
    DeviceCallCheck {
        trace_calls: trace.len() as u64,
        replay_calls: replay.len() as u64,
        matching: matching as u64,
        first_difference,
    }
}
