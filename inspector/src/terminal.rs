//! Text from a file on its way to a terminal.
//!
//! File names, function names and annotations come from the snapshot, which anyone may have
//! written: an escape sequence in a frame's file name would retitle or clear the user's
//! terminal when `report`, `summary` or `ranks` prints it. Every such string goes through
//! [`sanitize`] before it is written to a terminal or a text report (the dashboard has its
//! own equivalent in `vramscope-tui`): control characters are shown as `\u{..}` escapes, so
//! nothing is lost and nothing is executed.

use std::borrow::Cow;

/// `text` with every control character (C0, DEL, C1) written as a `\u{..}` escape.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_run() {
        assert_eq!(sanitize("train.py"), "train.py");
        let hostile = "x.py\u{1b}]0;pwned\u{7}\u{1b}[2J\r\u{9b}31m";
        let shown = sanitize(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert_eq!(shown, "x.py\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{d}\\u{9b}31m");
    }
}
