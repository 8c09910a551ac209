//! The colour theme: every style the dashboard draws with, in one place.
//!
//! [`Theme`] is plain data (colours on or off) with one method per meaning (allocated bytes,
//! the time cursor, an alert), so that the widgets of `crate::ui` never name a colour. With
//! `NO_COLOR` set it uses no colour at all, only bold, dim and reverse, and the panels tell
//! states apart by their characters. It imports nothing of the crate: `crate::view` carries a
//! theme in its view model, `crate::app` and `crate::fleet` keep the user's choice, and
//! `crate::ui` re-exports it as `ui::Theme`.

use ratatui::style::{Color, Modifier, Style};
use vramscope_analysis::detect::Severity;

/// Every style the dashboard uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    /// Whether to use colours.
    pub color: bool,
}

impl Theme {
    /// Colours unless `NO_COLOR` is set to a non-empty value.
    pub fn from_env() -> Theme {
        Theme {
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    /// A theme with colours.
    pub fn colored() -> Theme {
        Theme { color: true }
    }

    /// A theme without colours.
    pub fn plain() -> Theme {
        Theme { color: false }
    }

    fn fg(self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }

    /// Allocated bytes and blocks.
    pub fn allocated(self) -> Style {
        self.fg(Color::Green)
    }

    /// Reserved bytes.
    pub fn reserved(self) -> Style {
        self.fg(Color::Blue)
    }

    /// The capacity line and OOM marks.
    pub fn capacity(self) -> Style {
        self.fg(Color::Red)
    }

    /// Pending-free blocks.
    pub fn pending(self) -> Style {
        self.fg(Color::Yellow)
    }

    /// Free space in segments that hold live blocks (inactive split).
    pub fn split(self) -> Style {
        self.fg(Color::Magenta)
    }

    /// Free space in segments without live blocks.
    pub fn free(self) -> Style {
        if self.color {
            Style::new().fg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::DIM)
        }
    }

    /// Panel titles.
    pub fn title(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    /// The selected row.
    pub fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    /// Secondary text.
    pub fn dim(self) -> Style {
        self.free()
    }

    /// Key names in the help bar.
    pub fn key(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    /// Column headers.
    pub fn header(self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }

    /// Alerts: disconnection, OOMs, errors.
    pub fn alert(self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    /// The time cursor.
    pub fn cursor(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    /// A finding's severity.
    pub fn severity(self, severity: Severity) -> Style {
        match severity {
            Severity::Error => self.alert(),
            Severity::Warning => self.fg(Color::Yellow).add_modifier(Modifier::BOLD),
            Severity::Info => self.fg(Color::Blue),
        }
    }
}
