//! Text from a file on its way to a terminal, a text file or a CI log: the one sanitizer.
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
//! A CI runner reads what a job prints as well: GitHub Actions obeys a line that starts with
//! `::` (`::add-mask::`, `::stop-commands::`, `::error file=…`) and, in its older parser, `##[`
//! anywhere in a line (`##[set-output name=x;]`). A name is one line (its line breaks are
//! escaped above), and [`neutralize_commands`] shows the `[` of every `##[` as `\u{5b}` and the
//! first `:` of a `::` that starts a line (after spaces and tabs) as `\u{3a}`, so that no text
//! from a file is a command to the runner.
//!
//! Four doors, one rule: [`sanitize`] escapes a single string from a file where it is
//! embedded (newlines and tabs included: a name is one line; `##[` too); [`sanitize_output`]
//! is what the command line passes every text, markdown and error message through on its way
//! out (keeping the newlines and tabs of the layout, and with `keep_sgr` the colour sequences
//! of the text report, and neutralizing workflow commands); [`sanitize_annotations`] is the
//! same for `--format github`, whose lines are vramscope's own workflow commands;
//! [`sanitize_json`] writes the same characters as JSON's own `\uXXXX` escapes, which
//! serde_json leaves raw for DEL, the C1 controls, the bidi controls and U+2028/U+2029 (and the
//! `[` of `##[` as `\u005b`), so that JSON or an HTML page printed to a terminal or a CI log is
//! as safe and still parses to the same values. The dashboard has its own equivalent in
//! `vramscope-tui`. It lives in the model crate so that every crate that prints a name (the
//! replay's text included) reaches the same function; `vramscope_model::terminal`
//! re-exports it.

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

/// `text` with every [`unsafe_char`] (newlines and tabs too) written as a `\u{..}` escape,
/// and the `[` of every `##[` as `\u{5b}`: for one string from a file embedded in a line of
/// output.
pub fn sanitize(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) && !text.contains(LEGACY_COMMAND) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) || (c == '[' && out.ends_with("##")) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// What GitHub Actions' older parser obeys anywhere in a line: `##[command]`.
const LEGACY_COMMAND: &str = "##[";

/// Whether `text` holds a workflow command a CI runner would obey: `##[` anywhere, or `::` at
/// the start of a line after spaces and tabs.
pub fn has_workflow_command(text: &str) -> bool {
    text.contains(LEGACY_COMMAND) || text.lines().any(starts_command)
}

/// Whether `line`, after spaces and tabs, starts with `::`.
fn starts_command(line: &str) -> bool {
    line.trim_start_matches([' ', '\t']).starts_with("::")
}

/// `text` with every workflow command a CI runner would obey made inert, as text: the `[` of
/// each `##[` shown as `\u{5b}`, and the first `:` of a `::` that starts a line (after spaces
/// and tabs) as `\u{3a}`. Nothing vramscope prints starts a line with `::` or holds `##[`
/// (but `--format github`, whose commands are its own: [`sanitize_annotations`]).
pub fn neutralize_commands(text: &str) -> Cow<'_, str> {
    if !has_workflow_command(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.split_inclusive('\n') {
        let body = line.trim_start_matches([' ', '\t']);
        if body.starts_with("::") {
            out.push_str(&line[..line.len() - body.len()]);
            out.push_str("\\u{3a}");
            push_legacy_neutral(&mut out, &body[1..]);
        } else {
            push_legacy_neutral(&mut out, line);
        }
    }
    Cow::Owned(out)
}

/// Appends `text` with the `[` of every `##[` shown as `\u{5b}`.
fn push_legacy_neutral(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest.find(LEGACY_COMMAND) {
        out.push_str(&rest[..at + 2]);
        out.push_str("\\u{5b}");
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
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
    match escape_output(text, keep_sgr) {
        Cow::Borrowed(text) => neutralize_commands(text),
        Cow::Owned(text) => Cow::Owned(neutralize_commands(&text).into_owned()),
    }
}

/// The output of `--format github`, vramscope's own workflow commands, one a line (whose
/// renderer escaped the file's text for the runner): every [`unsafe_char`] but the newline
/// written as a `\u{..}` escape, as [`sanitize_output`] writes it, and the `[` of every `##[`
/// as `\u{5b}`; the `::` that starts each line is the command's own and stays.
pub fn sanitize_annotations(text: &str) -> Cow<'_, str> {
    let escaped = escape_output(text, false);
    if !escaped.contains(LEGACY_COMMAND) {
        return escaped;
    }
    let mut out = String::with_capacity(escaped.len() + 16);
    push_legacy_neutral(&mut out, &escaped);
    Cow::Owned(out)
}

/// [`sanitize_output`] without the workflow commands.
fn escape_output(text: &str, keep_sgr: bool) -> Cow<'_, str> {
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
/// and the tab written as a JSON escape (`\u001b`, `\u202e`), and the `[` of every `##[` as
/// `\u005b`. serde_json already escapes
/// the C0 controls inside strings and writes none outside them, so in its output this
/// touches only characters inside strings, and the document reads back to the same values.
pub fn sanitize_json(text: &str) -> Cow<'_, str> {
    use std::fmt::Write as _;
    let flagged = |c: char| unsafe_char(c) && c != '\n' && c != '\t';
    if !text.chars().any(flagged) && !text.contains(LEGACY_COMMAND) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if flagged(c) {
            // Every such character is in the Basic Multilingual Plane: one `\uXXXX`.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else if c == '[' && out.ends_with("##") {
            // Only inside a string: JSON's own brackets never follow `#`.
            out.push_str("\\u005b");
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

    #[test]
    fn workflow_commands_from_a_file_are_inert_in_every_door() {
        let name = "x.py\n::add-mask::s\r\n  ::stop-commands::t\n##[set-output name=x;]y";
        // One name: its line breaks escaped, its legacy command shown as text.
        let one = sanitize(name);
        assert_eq!(
            one,
            "x.py\\u{a}::add-mask::s\\u{d}\\u{a}  ::stop-commands::t\\u{a}##\\u{5b}set-output name=x;]y"
        );
        assert!(!has_workflow_command(&one));
        // A whole output: the layout's lines stay, no line starts a command.
        let whole = format!("report\n{name}\n\t::error::z\n");
        let out = sanitize_output(&whole, false);
        assert!(!has_workflow_command(&out), "{out}");
        assert_eq!(
            out,
            "report\nx.py\n\\u{3a}:add-mask::s\\u{d}\n  \\u{3a}:stop-commands::t\n##\\u{5b}set-output name=x;]y\n\t\\u{3a}:error::z\n"
        );
        assert!(matches!(
            sanitize_output("a :: b\n", false),
            Cow::Borrowed(_)
        ));
        // vramscope's own annotations keep their `::`, and nothing else acts.
        let github = sanitize_annotations("::error file=a.py::##[add-mask]x\u{1b}c\n");
        assert_eq!(github, "::error file=a.py::##\\u{5b}add-mask]x\\u{1b}c\n");
        // JSON reads back to the same text.
        let value = serde_json::json!({"site": name});
        let json = serde_json::to_string_pretty(&value).unwrap();
        let safe = sanitize_json(&json);
        assert!(!has_workflow_command(&safe), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
    }
}
