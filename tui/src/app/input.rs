//! Keys and the mouse: what each does in each panel.
//!
//! [`App::handle_key`] reads a key in the light of what is open (a filter being typed, the help
//! overlay, a panel's detail view) and turns it into a choice (panel, filter, sort order, fold)
//! or a move of the time cursor (`crate::app::cursor`); [`App::handle_mouse`] maps clicks to
//! tabs, rows and timeline columns with the same layout `crate::ui` draws
//! (`crate::ui::layout`). `crate::ui::help::keys_for` lists the same keys for the help bar.

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::Position;

use super::App;
use crate::ui;
use crate::view::{Input, KindFilter, Panel};

impl App {
    /// Reacts to one key press.
    pub fn handle_key(&mut self, key: KeyEvent) {
        if key.kind == KeyEventKind::Release {
            return;
        }
        self.intro = None;
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('q')) {
            self.quit = true;
            return;
        }
        if let Some(input) = self.input.as_mut() {
            match key.code {
                KeyCode::Esc => self.input = None,
                KeyCode::Enter => {
                    let Input { target, text } = self.input.take().unwrap_or(Input {
                        target: self.panel,
                        text: String::new(),
                    });
                    self.set_filter(target, text);
                }
                KeyCode::Backspace => {
                    input.text.pop();
                    let (t, text) = (input.target, input.text.clone());
                    self.set_filter(t, text);
                }
                KeyCode::Char(c) if !ctrl => {
                    input.text.push(c);
                    let (t, text) = (input.target, input.text.clone());
                    self.set_filter(t, text);
                }
                _ => {}
            }
            return;
        }
        if self.help {
            // Any key closes the help; q still quits.
            self.help = false;
            if key.code == KeyCode::Char('q') {
                self.quit = true;
            }
            return;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Esc => {
                if self.sites.detail && self.panel == Panel::Sites {
                    self.sites.detail = false;
                } else if !self.current_filter().is_empty() {
                    self.set_filter(self.panel, String::new());
                } else {
                    self.quit = true;
                }
            }
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Tab => self.panel = Panel::ALL[(self.panel.index() + 1) % Panel::ALL.len()],
            KeyCode::BackTab => {
                let n = Panel::ALL.len();
                self.panel = Panel::ALL[(self.panel.index() + n - 1) % n]
            }
            KeyCode::Char(c @ '1'..='7') => {
                self.panel = Panel::ALL[(c as u8 - b'1') as usize];
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.toggle_pause(),
            KeyCode::Char('s') => self.save_snapshot(),
            KeyCode::Char('/') => {
                let target = match self.panel {
                    Panel::Sites | Panel::Findings | Panel::Events => self.panel,
                    _ => Panel::Events,
                };
                self.panel = target;
                self.input = Some(Input {
                    target,
                    text: self.filter_of(target).to_string(),
                });
            }
            KeyCode::Char('+') | KeyCode::Char('=') => self.zoom_in(),
            KeyCode::Char('-') | KeyCode::Char('_') => self.zoom = self.zoom.saturating_sub(1),
            KeyCode::Char('[') => self.step_jump(false),
            KeyCode::Char(']') => self.step_jump(true),
            KeyCode::Char(',') => self.set_cursor(self.pos().saturating_sub(1)),
            KeyCode::Char('.') => self.set_cursor(self.pos() + 1),
            KeyCode::Home | KeyCode::Char('g') => self.set_cursor(0),
            KeyCode::End | KeyCode::Char('G') => {
                self.cursor = None;
                if !self.is_live() || self.paused {
                    self.cursor = Some(self.data.len());
                }
            }
            KeyCode::Char('c') => self.capacity_scale = !self.capacity_scale,
            KeyCode::Char('P') => self.go_to_peak(false),
            KeyCode::Char('R') => self.go_to_peak(true),
            KeyCode::Char('D') => self.next_device(),
            KeyCode::Left | KeyCode::Char('h') => self.horizontal(-1, key.modifiers),
            KeyCode::Right | KeyCode::Char('l') => self.horizontal(1, key.modifiers),
            KeyCode::Char('H') => self.horizontal(-10, key.modifiers),
            KeyCode::Char('L') => self.horizontal(10, key.modifiers),
            KeyCode::Up | KeyCode::Char('k') => self.vertical(-1),
            KeyCode::Down | KeyCode::Char('j') => self.vertical(1),
            KeyCode::PageUp => self.vertical(-(self.page_rows.max(1) as i64)),
            KeyCode::PageDown => self.vertical(self.page_rows.max(1) as i64),
            KeyCode::Enter => self.enter(),
            KeyCode::Char('o') if self.panel == Panel::Sites => {
                self.sites.sort = self.sites.sort.next();
            }
            KeyCode::Char('t') if self.panel == Panel::Sites => {
                self.sites.tree = !self.sites.tree;
                self.sites.detail = false;
                self.sites.selected = 0;
            }
            KeyCode::Char('f') if self.panel == Panel::Sites => {
                if self.sites.detail && !self.sites.tree {
                    // The stack view: every frame, or the user's with framework runs folded.
                    self.sites.all_frames = !self.sites.all_frames;
                } else {
                    self.sites.hide_framework = !self.sites.hide_framework;
                }
            }
            KeyCode::Char('e') if self.panel == Panel::Events => {
                self.events.kind = self.events.kind.next();
                self.events.selected = None;
            }
            _ => {}
        }
    }

    fn filter_of(&self, panel: Panel) -> &str {
        match panel {
            Panel::Sites => &self.sites.filter,
            Panel::Findings => &self.findings.filter,
            _ => &self.events.filter,
        }
    }

    fn current_filter(&self) -> &str {
        match self.panel {
            Panel::Sites | Panel::Findings | Panel::Events => self.filter_of(self.panel),
            _ => "",
        }
    }

    fn set_filter(&mut self, panel: Panel, text: String) {
        match panel {
            Panel::Sites => {
                self.sites.filter = text;
                self.sites.selected = 0;
            }
            Panel::Findings => {
                self.findings.filter = text;
                self.findings.selected = 0;
            }
            _ => {
                self.events.filter = text;
                self.events.selected = None;
            }
        }
    }

    fn horizontal(&mut self, dir: i64, modifiers: KeyModifiers) {
        let fine = matches!(self.panel, Panel::Overview | Panel::Timeline);
        if fine || modifiers.contains(KeyModifiers::SHIFT) {
            self.move_by_columns(dir);
        } else if dir < 0 {
            self.step_jump(false);
        } else {
            self.step_jump(true);
        }
    }

    fn vertical(&mut self, delta: i64) {
        let clamp = |v: usize, d: i64, len: usize| -> usize {
            let v = v as i64 + d;
            v.clamp(0, len.saturating_sub(1) as i64) as usize
        };
        match self.panel {
            Panel::Sites => {
                let len = if self.sites.tree {
                    self.view.tree.len()
                } else {
                    self.view.sites.len()
                };
                self.sites.selected = clamp(self.sites.selected, delta, len);
            }
            Panel::Findings => {
                self.findings.selected =
                    clamp(self.findings.selected, delta, self.view.findings.len());
            }
            Panel::Events => {
                let list = &self.view.events;
                if list.is_empty() {
                    return;
                }
                let current = self
                    .events
                    .selected
                    .and_then(|s| u32::try_from(s).ok())
                    .and_then(|s| list.binary_search(&s).ok())
                    .unwrap_or_else(|| ui::events::cursor_row(list, self.pos()));
                let row = clamp(current, delta, list.len());
                self.events.selected = Some(list[row] as usize);
            }
            Panel::Memory => {
                self.memory.selected = clamp(self.memory.selected, delta, self.view.memory.len());
            }
            Panel::Segments => {
                let len = self.data.state_at(self.pos()).segments.len();
                self.segment_scroll = clamp(self.segment_scroll, delta, len);
            }
            Panel::Overview | Panel::Timeline => {
                if delta < 0 {
                    self.zoom_in();
                } else {
                    self.zoom = self.zoom.saturating_sub(1);
                }
            }
        }
    }

    fn enter(&mut self) {
        match self.panel {
            Panel::Sites if !self.sites.tree => self.sites.detail = !self.sites.detail,
            Panel::Sites => {
                // Fold or unfold the selected node of the stack tree.
                if let Some(row) = self.view.tree.get(self.sites.selected) {
                    if row.has_children && !self.sites.collapsed.remove(&row.path) {
                        self.sites.collapsed.insert(row.path.clone());
                    }
                    // The rows below moved: the next key of the same batch must see them.
                    self.prepare();
                }
            }
            Panel::Memory => {
                // Fold or unfold the selected node of the call tree.
                if let Some(row) = self.view.memory.get(self.memory.selected) {
                    if row.has_children && !self.memory.toggled.remove(&row.path) {
                        self.memory.toggled.insert(row.path.clone());
                    }
                    self.prepare();
                }
            }
            Panel::Events => {
                if let Some(i) = self.events.selected {
                    self.set_cursor(i + 1);
                    self.set_status(format!("time cursor at event {}", i + 1));
                }
            }
            Panel::Findings => {
                use vramscope_analysis::detect::FindingKind;
                let finding = self
                    .view
                    .findings
                    .get(self.findings.selected)
                    .and_then(|&i| self.analysis.as_ref()?.findings.get(i));
                let Some(finding) = finding else {
                    return;
                };
                // Waits, copies and OOMs are events, not blocks: the event log shows them (a
                // sync's site holds no memory, and its call-site detail would be empty).
                let events = match finding.kind {
                    FindingKind::SyncInLoop | FindingKind::TransferHeavy => {
                        Some((KindFilter::Transfers, "copies and waits"))
                    }
                    FindingKind::Oom => Some((KindFilter::Ooms, "failed allocations")),
                    _ => None,
                };
                if let Some((kind, what)) = events {
                    let site = finding.site.clone().unwrap_or_default();
                    self.panel = Panel::Events;
                    self.events.kind = kind;
                    self.events.filter = site.clone();
                    self.events.selected = None;
                    self.set_status(if site.is_empty() {
                        format!("the {what}")
                    } else {
                        format!("the {what} at {site}")
                    });
                    return;
                }
                // Anything else: the finding's site in the call-site panel.
                if let Some(site) = finding.site.clone() {
                    self.panel = Panel::Sites;
                    self.sites.tree = false;
                    self.sites.filter = site;
                    self.sites.selected = 0;
                    self.sites.detail = true;
                }
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------------------------------
    // The mouse.

    /// Reacts to a mouse event: clicks on tabs, rows and the timeline; the wheel scrolls.
    pub fn handle_mouse(&mut self, mouse: MouseEvent) {
        let at = Position::new(mouse.column, mouse.row);
        let layout = ui::layout(self.area, self.panel);
        match mouse.kind {
            MouseEventKind::ScrollUp => self.vertical(-3),
            MouseEventKind::ScrollDown => self.vertical(3),
            MouseEventKind::Down(MouseButton::Left) => {
                if layout.tabs.contains(at) {
                    if let Some(p) = ui::tab_at(layout.tabs, mouse.column) {
                        self.panel = p;
                    }
                    return;
                }
                if let Some(chart) = layout.timeline.filter(|r| r.contains(at)) {
                    let plot = ui::timeline::plot_area(chart);
                    if plot.width > 0 {
                        let (a, b) = self.window(plot.width as usize);
                        let col = mouse.column.saturating_sub(plot.x).min(plot.width - 1);
                        let pos = a + (b - a) * (col as usize + 1) / plot.width as usize;
                        self.set_cursor(pos);
                    }
                    return;
                }
                if layout.body.contains(at) {
                    let row = mouse.row.saturating_sub(layout.body.y + 2) as usize;
                    match self.panel {
                        Panel::Sites => self.sites.selected = self.sites_scroll_base() + row,
                        Panel::Findings => self.findings.selected = row,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn sites_scroll_base(&self) -> usize {
        self.sites
            .selected
            .saturating_sub(self.page_rows.saturating_sub(1))
    }
}
