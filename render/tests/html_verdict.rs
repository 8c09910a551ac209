//! The HTML page opens on the answer (issue 32): the report's one-line verdict and its errors
//! and warnings, each with its line and fix, stand at the top of the page, above the figures
//! and the explorer's chart; a clean trace's page says so there and lists nothing.

use vramscope_analysis::report::{build_report, ReportOptions};

use vramscope_model::{Snapshot, TransferDirection};
use vramscope_render::{render, verdict, Format};
use vramscope_testkit::clean_loop;

/// A clean loop with a leak at `train.py:33` and a sync per element at `train.py:44`.
fn leaky(steps: u64) -> Snapshot {
    let mut t = clean_loop(0);
    let leak = t.site("train.py", 33, "train");
    let item = t.site("train.py", 44, "log");
    for _ in 0..steps {
        t.step();
        t.alloc(leak, 4 << 20);
        for _ in 0..20 {
            t.transfer(item, TransferDirection::DeviceToHost, 4);
        }
    }
    t.finish()
}

/// The page of `snapshot` with the explorer, and its report's verdict.
fn page_of(snapshot: &Snapshot) -> (String, String, vramscope_analysis::report::Report) {
    let mut options = ReportOptions::default();
    options.input = Some("run.json".to_string());
    options.explorer = true;
    let report = build_report(snapshot, &options);
    (
        render(&report, Format::Html, false),
        verdict(&report),
        report,
    )
}

/// Where `needle` first stands in `page`, failing with the page when it is absent.
fn at(page: &str, needle: &str) -> usize {
    page.find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the page:\n{page}"))
}

#[test]
fn the_verdict_and_the_errors_stand_above_the_chart() {
    let (page, verdict, report) = page_of(&leaky(10));
    let problems: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.severity >= vramscope_analysis::detect::Severity::Warning)
        .collect();
    assert!(!problems.is_empty(), "the planted leak is found");
    assert!(
        problems
            .iter()
            .any(|f| f.site.as_deref() == Some("train.py:33")),
        "{verdict}"
    );
    let chart = at(&page, "<canvas id=\"chart\"");
    let stats = at(&page, "<ul class=\"stats\">");
    let shown = at(&page, "<div id=\"verdict\"");
    assert!(shown < stats && shown < chart, "the verdict comes first");
    // The verdict's own words, escaped as HTML is.
    let escaped = vramscope_render::html::escape(&verdict);
    assert!(at(&page, &escaped) < chart, "{verdict}");
    assert!(verdict.contains("train.py:33"), "{verdict}");
    let list = at(&page, "<ul id=\"problems\">");
    assert!(list < chart);
    let top = &page[list..chart];
    for f in &problems {
        let site = vramscope_render::html::escape(f.site_label());
        let fix = vramscope_render::html::escape(&f.fix);
        assert!(
            top.contains(&format!("<code>{site}</code>")),
            "{site}: {top}"
        );
        assert!(top.contains(&fix), "{fix}: {top}");
    }
    // The list links each problem to its row of the findings table, below.
    assert!(top.contains("href=\"#finding-0\""), "{top}");
    assert!(at(&page, "<tr id=\"finding-0\"") > chart);
    // The worst severity colours the verdict.
    let worst = problems.iter().map(|f| f.severity).max().unwrap();
    assert!(
        page.contains(&format!(
            "<div id=\"verdict\" class=\"verdict-{}\">",
            worst.as_str()
        )),
        "{}",
        &page[shown..list]
    );
}

#[test]
fn a_clean_page_says_so_at_the_top_and_lists_nothing() {
    let (page, verdict, _) = page_of(&clean_loop(6).finish());
    assert_eq!(verdict, "no leaks, sync or churn problems found");
    let shown = at(
        &page,
        "<div id=\"verdict\" class=\"verdict-ok\">no leaks, sync or churn problems found</div>",
    );
    assert!(shown < at(&page, "<canvas id=\"chart\""));
    assert!(!page.contains("<ul id=\"problems\">"));
}

/// The page's figures are the text report's lines, one for one and in order: where the steps
/// came from, the peak's event and what the memory is made of among them.
#[test]
fn the_pages_figures_are_the_text_reports_lines() {
    let mut snapshot = leaky(6);
    snapshot.tags = vec!["weights".to_string()];
    if let Some(e) = snapshot
        .events
        .to_mut()
        .iter_mut()
        .find(|e| e.kind == vramscope_model::EventKind::Alloc)
    {
        e.tag = vramscope_model::Id::new(0);
    }
    let (page, _, report) = page_of(&snapshot);
    let text = render(&report, Format::Text, false);
    let start = at(&page, "<ul class=\"stats\">");
    let end = start + at(&page[start..], "</ul>");
    let unescape = |item: &str| {
        item.trim_end_matches("</li>")
            .replace("&#39;", "'")
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    };
    let listed: Vec<String> = page[start..end]
        .split("<li>")
        .skip(1)
        .map(unescape)
        .collect();
    let header: Vec<&str> = text
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(listed, header, "{page}");
    for needle in ["steps from", "(after event", "at the peak", "at the end"] {
        assert!(
            listed.iter().any(|line| line.contains(needle)),
            "{needle}: {listed:?}"
        );
    }
}
