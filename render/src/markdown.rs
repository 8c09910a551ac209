//! Text from a file in markdown: the one escaper every markdown writer calls.
//!
//! A site name, a file name or any other text a snapshot holds is written into markdown
//! (`report --format markdown`, `ranks --format markdown`) as literal text: no newline may end
//! a table row or open a block, and no `[x](y)`, `![x](y)`, `<script>`, `<http://…>`,
//! heading, emphasis or entity may come alive where the markdown is rendered. [`escape`] does
//! that for text in a paragraph, a list item or a table cell by backslash-escaping the
//! characters CommonMark gives a meaning (every one it allows to be escaped means itself after
//! the backslash); [`code_span`] writes text as a code span, inside which nothing but the
//! closing backtick and, in a table, the pipe has a meaning. Both turn line breaks into
//! spaces. Characters that act on a terminal are the business of `vramscope_model::terminal`, which the
//! command line applies to the whole output after this.

/// `text` as literal markdown text, for a paragraph, a list item or a table cell: the
/// characters that open inline markup (`\ | * _ [ ] < > ! ` ~`), an entity (`&name;`,
/// `&#…;`) or one of GitHub's bare autolinks (`://`, `www.`, `@`) are escaped with a
/// backslash; the characters that open a block (`#`, `-`, `+`, `=`, `N.`, `N)`) are escaped
/// where the text begins; line breaks become spaces.
pub fn escape(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let block_marker = block_marker(&chars);
    let mut out = String::with_capacity(text.len() + 8);
    for (i, &c) in chars.iter().enumerate() {
        let after = |s: &[char]| chars.get(i + 1..i + 1 + s.len()) == Some(s);
        let escaped = match c {
            '\\' | '|' | '`' | '*' | '_' | '<' | '>' | '[' | ']' | '!' | '~' | '@' => true,
            '\n' | '\r' | '\u{2028}' | '\u{2029}' => {
                out.push(' ');
                continue;
            }
            // `&amp;`, `&#x202e;`: an entity would be read as the character it names.
            '&' => chars
                .get(i + 1)
                .is_some_and(|n| *n == '#' || n.is_ascii_alphanumeric()),
            // `https://…` and `www.…` are links on GitHub even without `<>`.
            ':' => after(&['/', '/']),
            '.' => {
                i >= 3
                    && chars[i - 3..i].iter().all(|w| w.eq_ignore_ascii_case(&'w'))
                    && (i == 3 || !chars[i - 4].is_alphanumeric())
            }
            _ => false,
        };
        if escaped || block_marker == Some(i) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Where a text that begins a line would open a block (a heading `#`, a list item `-`, `+`,
/// `3.` or `3)`, a setext underline `=` or `-`): the position of the character to escape.
fn block_marker(chars: &[char]) -> Option<usize> {
    let lead = chars.iter().position(|&c| c != ' ')?;
    // A list marker counts only when a space, a tab or the end follows it (`-1`, `1.5` are
    // text).
    let spaced = |at: usize| matches!(chars.get(at), None | Some(' ' | '\t'));
    match chars[lead] {
        '#' | '=' => Some(lead),
        '-' if spaced(lead + 1) || chars.get(lead + 1) == Some(&'-') => Some(lead),
        '+' if spaced(lead + 1) => Some(lead),
        d if d.is_ascii_digit() => {
            let end = chars[lead..]
                .iter()
                .position(|c| !c.is_ascii_digit())
                .map(|p| lead + p)?;
            (matches!(chars[end], '.' | ')') && spaced(end + 1)).then_some(end)
        }
        _ => None,
    }
}

/// `text` as a code span (`` `text` ``): a backtick in it becomes `'`, line breaks become
/// spaces, and `in_table` escapes `|`, which GitHub's tables read as a cell's end even inside
/// a code span (and show as `|` there).
pub fn code_span(text: &str, in_table: bool) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('`');
    for c in text.chars() {
        match c {
            '`' => out.push('\''),
            '\n' | '\r' | '\u{2028}' | '\u{2029}' => out.push(' '),
            '|' if in_table => out.push_str("\\|"),
            _ => out.push(c),
        }
    }
    out.push('`');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_report_shows_are_unchanged_or_escaped_as_before() {
        assert_eq!(escape("train.py:42 (forward)"), "train.py:42 (forward)");
        assert_eq!(
            escape("a|b*c_d`e<f>[g]\\"),
            "a\\|b\\*c\\_d\\`e\\<f\\>\\[g\\]\\\\"
        );
        assert_eq!(escape("one\ntwo\r"), "one two ");
        assert_eq!(escape("MmBackward0 (backward)"), "MmBackward0 (backward)");
        assert_eq!(
            escape("Optimizer.step#AdamW.step"),
            "Optimizer.step#AdamW.step"
        );
        assert_eq!(escape("f(at::Tensor const&)"), "f(at::Tensor const&)");
        assert_eq!(escape("peak 1.5 GiB - 3 steps"), "peak 1.5 GiB - 3 steps");
        assert_eq!(escape("12 steps."), "12 steps.");
        assert_eq!(escape("1.5 GiB at the peak"), "1.5 GiB at the peak");
        assert_eq!(escape("-1 byte"), "-1 byte");
    }

    #[test]
    fn markup_from_a_file_is_escaped() {
        assert_eq!(escape("![x](y)"), "\\!\\[x\\](y)");
        assert_eq!(escape("# title"), "\\# title");
        assert_eq!(escape("  - item"), "  \\- item");
        assert_eq!(escape("3. item"), "3\\. item");
        assert_eq!(escape("10) item"), "10\\) item");
        assert_eq!(escape("---"), "\\---");
        assert_eq!(escape("="), "\\=");
        assert_eq!(escape("&#x202e;&amp;"), "\\&#x202e;\\&amp;");
        assert_eq!(escape("see https://x.io"), "see https\\://x.io");
        assert_eq!(escape("www.x.io"), "www\\.x.io");
        assert_eq!(escape("a@b.io"), "a\\@b.io");
    }

    #[test]
    fn code_spans_hold_any_text() {
        assert_eq!(code_span("x.py:3", true), "`x.py:3`");
        assert_eq!(code_span("a`b|c\nd", true), "`a'b\\|c d`");
        assert_eq!(code_span("a|b", false), "`a|b`");
    }
}
