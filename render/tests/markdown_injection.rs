//! No markup from a file comes alive in the markdown vramscope writes (issue 33, item 10).
//!
//! A trace whose call sites, functions and device name are markdown and HTML (links, images,
//! headings, `<script>`, autolinks, entities, a newline that ends a table row) is rendered by
//! `report --format markdown` and `ranks --format markdown`, and the output is parsed by a
//! real CommonMark renderer (pulldown-cmark, with GitHub's tables). Against a clean twin (the
//! same trace with plain names), the hostile one has the same links, images, headings and
//! table rows (only the writer's own), no HTML at all, and each hostile name is there as the
//! literal text it was.

use std::path::PathBuf;

use pulldown_cmark::{Event, Options, Parser, Tag};
use vramscope_analysis::ranks;
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_import::{ImportError, ImportErrorKind};
use vramscope_model::Snapshot;
use vramscope_render::{render, Format};
use vramscope_testkit::{clean_loop, MIB};

/// Names that would be markup if written as they are.
const HOSTILE: [&str; 10] = [
    "[click](http://evil.example/a)",
    "![pixel](http://evil.example/p.png)",
    "<script>alert(1)</script>",
    "# Heading from a file",
    "<http://evil.example/auto>",
    "x | y",
    "<img src=x onerror=alert(1)>",
    "[ref]: http://evil.example/r",
    "&#x202e;&lt;b&gt; *em* _em_ `code` ~~gone~~",
    "line one\n# heading\n<div>raw</div>",
];

/// What the rendered markdown holds: counts of the constructs a file must not create, and
/// its text.
#[derive(Debug, Default, PartialEq)]
struct Rendered {
    links: usize,
    images: usize,
    headings: usize,
    html: usize,
    table_rows: usize,
    text: String,
}

fn rendered(markdown: &str) -> Rendered {
    let mut out = Rendered::default();
    for event in Parser::new_ext(
        markdown,
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH,
    ) {
        match event {
            Event::Start(Tag::Link { .. }) => out.links += 1,
            Event::Start(Tag::Image { .. }) => out.images += 1,
            Event::Start(Tag::Heading { .. }) => out.headings += 1,
            Event::Start(Tag::HtmlBlock) | Event::Html(_) | Event::InlineHtml(_) => out.html += 1,
            Event::Start(Tag::TableRow) | Event::Start(Tag::TableHead) => out.table_rows += 1,
            Event::Text(text) | Event::Code(text) => out.text.push_str(&text),
            Event::SoftBreak | Event::HardBreak => out.text.push(' '),
            _ => {}
        }
    }
    out
}

/// A trace whose leaking sites (files and functions) and device carry `names`.
fn trace(names: &[&str], device: &str) -> Snapshot {
    let mut t = clean_loop(0);
    let sites: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| t.site(name, 100 + i as u32, name))
        .collect();
    for _ in 0..8 {
        t.step();
        for &site in &sites {
            t.alloc(site, MIB);
        }
    }
    let mut snapshot = t.finish();
    snapshot.device.name = device.to_string();
    snapshot
}

fn clean_names() -> Vec<String> {
    (0..HOSTILE.len()).map(|i| format!("clean{i}.py")).collect()
}

/// The hostile names as a reader sees them once rendered: the text itself, one line.
fn literal(name: &str) -> String {
    name.replace('\n', " ")
}

fn assert_same_structure(what: &str, hostile: &Rendered, clean: &Rendered) {
    assert_eq!(hostile.html, 0, "{what}: HTML from a file: {hostile:?}");
    assert_eq!(clean.html, 0, "{what}: the writer's own HTML?");
    assert_eq!(hostile.links, clean.links, "{what}: links");
    assert_eq!(hostile.images, clean.images, "{what}: images");
    assert_eq!(hostile.headings, clean.headings, "{what}: headings");
    assert_eq!(hostile.table_rows, clean.table_rows, "{what}: table rows");
}

#[test]
fn a_report_in_markdown_shows_markup_from_a_file_as_text() {
    let options = ReportOptions::default();
    let clean_names = clean_names();
    let clean_refs: Vec<&str> = clean_names.iter().map(String::as_str).collect();
    let hostile = render(
        &build_report(&trace(&HOSTILE, HOSTILE[0]), &options),
        Format::Markdown,
        false,
    );
    let clean = render(
        &build_report(&trace(&clean_refs, "clean device"), &options),
        Format::Markdown,
        false,
    );
    let (hostile_md, clean_md) = (rendered(&hostile), rendered(&clean));
    assert!(clean_md.headings >= 2, "the writer's own headings: {clean}");
    assert!(clean_md.table_rows >= 3, "the writer's own tables: {clean}");
    assert_same_structure("report", &hostile_md, &clean_md);
    // Each name that has no control character is shown as the text it is (names with a
    // newline are shown escaped by the terminal sanitizer, `\u{a}`).
    for name in HOSTILE.iter().filter(|n| !n.contains('\n')) {
        assert!(
            hostile_md.text.contains(&literal(name)),
            "{name:?} is not shown as text:\n{}\n---\n{hostile}",
            hostile_md.text
        );
    }
}

#[test]
fn ranks_in_markdown_show_markup_from_a_file_as_text() {
    // The paths name no rank, so the numbering sentence quotes them.
    let entries = |names: &[&str]| -> Vec<(PathBuf, Result<Snapshot, ImportError>)> {
        let mut entries: Vec<(PathBuf, Result<Snapshot, ImportError>)> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                // The last rank keeps more: a rank_imbalance finding naming its sites.
                let sites: Vec<&str> = if i == names.len() - 1 {
                    names.to_vec()
                } else {
                    vec![names[0]]
                };
                (
                    PathBuf::from(format!("job/{name}.pickle")),
                    Ok(trace(&sites, name)),
                )
            })
            .collect();
        let failed = ImportError::new(
            &format!("job/{} {}.pickle", names[2], names[5]),
            ImportErrorKind::Structure {
                path: names[1].to_string(),
                message: names[9].to_string(),
            },
        );
        entries.push((
            PathBuf::from(format!("job/{}.pickle", names[3])),
            Err(failed),
        ));
        entries
    };
    let clean_names = clean_names();
    let clean_refs: Vec<&str> = clean_names.iter().map(String::as_str).collect();
    // Every row (`--all`): eleven ranks are past the few that print a row each by default.
    let hostile = vramscope_render::ranks::render_markdown_rows(
        &ranks::compare_results(&entries(&HOSTILE)),
        true,
    );
    let clean = vramscope_render::ranks::render_markdown_rows(
        &ranks::compare_results(&entries(&clean_refs)),
        true,
    );
    let (hostile_md, clean_md) = (rendered(&hostile), rendered(&clean));
    assert!(clean.contains("rank_imbalance"), "{clean}");
    assert!(clean.contains("could not be read"), "{clean}");
    assert_eq!(
        clean_md.table_rows,
        HOSTILE.len() + 2,
        "a row per rank and the head: {clean}"
    );
    assert_same_structure("ranks", &hostile_md, &clean_md);
    // The numbering sentence quotes the first path, the failed row its error, which is one
    // line: its line breaks are shown escaped (`terminal::sanitize`, issue 44).
    for name in [0, 1, 2, 5, 9].map(|i| HOSTILE[i]) {
        let shown = vramscope_model::terminal::sanitize(name);
        assert!(
            hostile_md.text.contains(&literal(name)) || hostile_md.text.contains(&*shown),
            "{name:?} is not shown as text:\n{}\n---\n{hostile}",
            hostile_md.text
        );
    }
}
