//! Moving the time cursor: by events, timeline columns, step starts and to the peaks, the
//! timeline's zoom, pause, and the switch between the devices of a multi-device file.
//!
//! Every move goes through [`App::set_cursor`], which clamps the position, leaves follow mode
//! (or, on live data, goes back to it at the newest event) and notes the time, so that
//! `App::tick` asks for a new analysis once the cursor rests. `crate::app::input` calls these
//! for keys and the mouse; the timeline's window comes from `crate::view::window`.

use std::time::Instant;

use super::App;
use crate::view;

impl App {
    /// Moves the cursor to `pos` (clamped), leaving follow mode.
    pub fn set_cursor(&mut self, pos: usize) {
        let pos = pos.min(self.data.len());
        if self.is_live() && pos == self.data.len() && !self.paused {
            self.cursor = None;
        } else {
            self.cursor = Some(pos);
        }
        self.cursor_moved = Some(Instant::now());
    }

    /// Events per timeline column at the current zoom, for a chart `width` columns wide.
    pub fn window(&self, width: usize) -> (usize, usize) {
        view::window(
            self.data.len(),
            self.zoom,
            self.pos(),
            self.following(),
            width,
        )
    }

    pub(super) fn move_by_columns(&mut self, columns: i64) {
        let width = usize::from(self.area.width.saturating_sub(12)).max(1);
        let (a, b) = self.window(width);
        let per = ((b - a) as f64 / width as f64).max(1.0);
        let delta = (per * columns as f64).round() as i64;
        let pos = self.pos() as i64 + delta;
        self.set_cursor(pos.max(0) as usize);
    }

    pub(super) fn step_jump(&mut self, forward: bool) {
        let pos = self.pos();
        let starts = self.data.step_starts();
        let target = if forward {
            starts.iter().map(|&(_, i)| i).find(|&i| i > pos)
        } else {
            starts.iter().map(|&(_, i)| i).rev().find(|&i| i < pos)
        };
        match target {
            Some(t) => self.set_cursor(t),
            None if forward => self.set_cursor(self.data.len()),
            None => self.set_cursor(0),
        }
    }

    /// Moves the cursor to where allocated (or, with `reserved`, reserved) bytes first reach
    /// their peak, and says so in the help bar.
    pub fn go_to_peak(&mut self, reserved: bool) {
        let (pos, what) = if reserved {
            (self.data.peak_reserved_pos(), "reserved")
        } else {
            (self.data.peak_allocated_pos(), "allocated")
        };
        self.set_cursor(pos);
        let usage = self.data.usage_at(pos);
        let bytes = if reserved {
            usage.reserved
        } else {
            usage.allocated
        };
        self.set_status(format!(
            "peak {what} {} after {} events",
            vramscope_model::format_bytes(bytes),
            pos
        ));
    }

    /// Shows the next device of a multi-device snapshot (`D`): its part becomes the data, the
    /// cursor goes to its peak and its findings are worked out afresh.
    pub fn next_device(&mut self) {
        let Some(switch) = self.devices.as_mut() else {
            self.set_status("one device in this file");
            return;
        };
        switch.current = (switch.current + 1) % switch.devices.len();
        let device = switch.devices[switch.current];
        let (current, count) = (switch.current, switch.devices.len());
        let part = vramscope_engine::devices::only_device(&switch.full, device);
        // The device's own steps, numbered as the report on it numbers them, and the findings
        // of its whole trace, shown beside the cursor's.
        let data = &mut self.data;
        let ((), whole) = crate::analysed_beside(part, |part| data.reset_shared(part));
        self.analysis = None;
        self.file_findings = Some(whole.findings);
        self.cursor = Some(self.data.peak_allocated_pos());
        self.set_status(format!(
            "cuda:{device} (device {} of {count}), at its peak",
            current + 1
        ));
    }

    /// Which peak the cursor is at, for the header: `Some("at peak")` at the peak of allocated
    /// bytes, `Some("at peak reserved")` at that of reserved bytes.
    pub fn at_peak(&self) -> Option<&'static str> {
        if self.following() && self.is_live() {
            return None;
        }
        let pos = self.pos();
        if pos == self.data.peak_allocated_pos() {
            Some("at peak")
        } else if pos == self.data.peak_reserved_pos() {
            Some("at peak reserved")
        } else {
            None
        }
    }

    pub(super) fn zoom_in(&mut self) {
        let n = self.data.len().max(1);
        if (n >> (self.zoom + 1)) >= 16 {
            self.zoom += 1;
        }
    }

    pub(super) fn toggle_pause(&mut self) {
        self.paused = !self.paused;
        if self.paused {
            if self.cursor.is_none() {
                self.cursor = Some(self.data.len());
            }
            self.set_status("paused: the view stays here (p resumes)");
        } else {
            if self.cursor == Some(self.data.len()) || self.is_live() {
                self.cursor = None;
            }
            self.set_status("resumed");
        }
        if let Some(s) = self.source.as_mut() {
            s.set_paused(self.paused);
        }
    }
}
