//! Text from a file on its way to a terminal or a text file: the one sanitizer.
//!
//! File names, function names, annotations, block states and every other string a snapshot
//! holds come from whoever wrote the file: an escape sequence in a frame's file name would
//! retitle or reset the user's terminal (`ESC ] 0;…BEL`, `ESC c`), write the clipboard
//! (OSC 52) or rename a tmux window when `report`, `summary`, `diff`, `replay` or `ranks`
//! prints it, and a bidi control (U+202E) or a line separator (U+2028) makes the text shown
//! differ from the text read. Every character that can do either is [`unsafe_char`]: the C0
//! controls, DEL, the C1 controls (which a UTF-8 terminal may obey as `CSI`, `OSC`, ...), the
//! bidi embeddings, overrides, isolates and marks (U+202A–U+202E, U+2066–U+2069, U+200E,
//! U+200F, U+061C) and U+2028/U+2029. Such a character is shown as a `\u{..}` escape, so
//! nothing is lost and nothing is executed.
//!
//! Three doors, one rule: [`sanitize`] escapes a single string from a file where it is
//! embedded (newlines and tabs included: a name is one line); [`sanitize_output`] is what the
//! command line passes every text, markdown and error message through on its way out (keeping
//! the newlines and tabs of the layout, and with `keep_sgr` the colour sequences of the text
//! report); [`sanitize_json`] writes the same characters as JSON's own `\uXXXX` escapes, which
//! serde_json leaves raw for DEL, the C1 controls, the bidi controls and U+2028/U+2029, so that
//! JSON or an HTML page printed to a terminal is as safe and still parses to the same values.
//! The dashboard has its own equivalent in `vramscope-tui`.

use std::borrow::Cow;

/// Whether `c` can change what a terminal does or how the text around it is shown: a C0 or
/// C1 control, DEL, a bidi control (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F, U+061C),
/// or U+2028/U+2029 (line and paragraph separators).
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{061c}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `c` as the escape this module shows it as: `\u{1b}`.
fn push_escaped(out: &mut String, c: char) {
    use std::fmt::Write as _;
    let _ = write!(out, "\\u{{{:x}}}", c as u32);
}

/// `text` with every [`unsafe_char`] (newlines and tabs too) written as a `\u{..}` escape:
/// for one string from a file embedded in a line of output.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The length of the SGR sequence (`ESC [ digits and semicolons m`, a colour or weight) that
/// starts `rest`, if one does.
fn sgr_len(rest: &str) -> Option<usize> {
    let body = rest.strip_prefix("\u{1b}[")?;
    let params = body
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b';')
        .count();
    (body.as_bytes().get(params) == Some(&b'm')).then_some(2 + params + 1)
}

/// A whole text output (a report, a table, an error message) on its way to a terminal or a
/// text file: every [`unsafe_char`] but the newline and the tab written as a `\u{..}`
/// escape. With `keep_sgr`, the colour sequences a text report paints with
/// (`ESC [ 1;31 m`, only digits and semicolons before the `m`) pass; every other escape
/// sequence is still shown escaped.
pub fn sanitize_output(text: &str, keep_sgr: bool) -> Cow<'_, str> {
    let flagged = |c: char| unsafe_char(c) && c != '\n' && c != '\t';
    if !text.chars().any(flagged) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if keep_sgr && c == '\u{1b}' {
            if let Some(len) = sgr_len(rest) {
                out.push_str(&rest[..len]);
                rest = &rest[len..];
                continue;
            }
        }
        if flagged(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

/// JSON text (or an HTML page whose data is JSON) with every [`unsafe_char`] but the newline
/// and the tab written as a JSON escape (`\u001b`, `\u202e`). serde_json already escapes
/// the C0 controls inside strings and writes none outside them, so in its output this
/// touches only characters inside strings, and the document reads back to the same values.
pub fn sanitize_json(text: &str) -> Cow<'_, str> {
    use std::fmt::Write as _;
    let flagged = |c: char| unsafe_char(c) && c != '\n' && c != '\t';
    if !text.chars().any(flagged) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if flagged(c) {
            // Every such character is in the Basic Multilingual Plane: one `\uXXXX`.
            let _ = write!(out, "\\u{:04x}", c as u32);
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

    #[test]
    fn bidi_controls_and_separators_are_shown_escaped() {
        let hostile = "a\u{202e}b\u{2066}c\u{2069}d\u{200e}\u{200f}\u{61c}\u{2028}\u{2029}\u{7f}";
        assert_eq!(
            sanitize(hostile),
            "a\\u{202e}b\\u{2066}c\\u{2069}d\\u{200e}\\u{200f}\\u{61c}\\u{2028}\\u{2029}\\u{7f}"
        );
        // Letters of right-to-left scripts, and other format characters, are text.
        assert_eq!(
            sanitize("\u{5e9}\u{5dc}.py\u{200d}"),
            "\u{5e9}\u{5dc}.py\u{200d}"
        );
        for c in [
            '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{2067}', '\u{2068}',
        ] {
            assert!(unsafe_char(c), "{:x}", c as u32);
        }
    }

    #[test]
    fn output_keeps_its_layout_and_only_plain_colours() {
        let clean = "a\tb\nc\n";
        assert!(matches!(sanitize_output(clean, false), Cow::Borrowed(_)));
        assert_eq!(
            sanitize_output("a\u{1b}[1;31mb\r\n", false),
            "a\\u{1b}[1;31mb\\u{d}\n"
        );
        assert_eq!(
            sanitize_output(
                "\u{1b}[1;31mERR\u{1b}[0m \u{1b}]52;c;aGk=\u{7}\u{1b}c\u{1b}[",
                true
            ),
            "\u{1b}[1;31mERR\u{1b}[0m \\u{1b}]52;c;aGk=\\u{7}\\u{1b}c\\u{1b}["
        );
        assert_eq!(
            sanitize_output("\u{9b}2J\u{202e}", true),
            "\\u{9b}2J\\u{202e}"
        );
    }

    #[test]
    fn json_escapes_read_back_to_the_same_text() {
        let value =
            serde_json::json!({"site": "x\u{1b}]52;c;aGk=\u{7}\u{9b}\u{202e}\u{2028}y\u{7f}"});
        let text = serde_json::to_string_pretty(&value).expect("serializes");
        let safe = sanitize_json(&text);
        assert!(!safe.chars().any(|c| unsafe_char(c) && c != '\n'), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back, value);
        assert!(matches!(
            sanitize_json("{\n\t\"a\": 1\n}"),
            Cow::Borrowed(_)
        ));
    }
}
