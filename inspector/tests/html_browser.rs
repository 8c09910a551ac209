//! The HTML explorer in a real browser: Debian's headless Chromium loads the report of each
//! shared trace, and the DOM after its scripts ran must show what the report says.
//!
//! For every trace the page must have drawn as many bands as the data holds, state the report's
//! peak allocated figure from the bands at the peak, list live blocks by site at the peak that
//! sum to that figure, and record no script error; driven by its self-test (keys, the wheel,
//! hover, click, a finding), it must show the end and the peak with tables that sum to the
//! report's figures, zoom, name the band under the mouse and pin it, still without errors. A 1400×900 screenshot of each page is kept
//! under `target/html-browser/` beside the pages themselves. Where Chromium is not installed
//! (`.ci/run` installs it where it can) or the traces are absent, the test says so in one
//! `skipped:` line and passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vramscope_caching::{CachingAllocator, SimDevice};
use vramscope_inspector::{html, import, report};
use vramscope_model::{AllocatorConfig, Snapshot};
use vramscope_testkit::{shared_trace, skip_notice};

/// The browsers tried, in order.
const BROWSERS: [&str; 3] = [
    "/usr/bin/chromium",
    "/usr/bin/chromium-headless-shell",
    "/usr/bin/chromium-browser",
];

/// How long one browser run may take before the test gives up on it.
const BROWSER_LIMIT: Duration = Duration::from_secs(180);

fn browser() -> Option<PathBuf> {
    BROWSERS.iter().map(PathBuf::from).find(|p| p.is_file())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the inspector lives in the workspace")
        .to_path_buf()
}

fn artefacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let dir = target.join("html-browser");
    std::fs::create_dir_all(&dir).expect("the artefact folder can be made");
    dir
}

/// Runs the browser headless on `page` (with `fragment` after `#` when not empty) with `extra`
/// arguments and returns its standard output.
fn run_browser(
    browser: &Path,
    page: &Path,
    fragment: &str,
    profile: &Path,
    extra: &[&str],
) -> String {
    let mut url = format!("file://{}", page.display());
    if !fragment.is_empty() {
        url = format!("{url}#{fragment}");
    }
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(&url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the browser starts");
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).map(|_| out)
    });
    let started = Instant::now();
    loop {
        if child
            .try_wait()
            .expect("the browser can be waited for")
            .is_some()
        {
            break;
        }
        if started.elapsed() > BROWSER_LIMIT {
            let _ = child.kill();
            panic!("the browser did not finish with {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader
        .join()
        .expect("the reader thread")
        .expect("the browser's output is text")
}

/// The value of `attr="…"` in the first tag after `anchor` in `dom`.
fn attribute(dom: &str, anchor: &str, attr: &str) -> Option<String> {
    let at = dom.find(anchor)?;
    let tag_start = dom[..at].rfind('<')?;
    let tag_end = at + dom[at..].find('>')?;
    let tag = &dom[tag_start..tag_end];
    let key = format!("{attr}=\"");
    let v = tag.find(&key)? + key.len();
    let end = v + tag[v..].find('"')?;
    Some(tag[v..end].to_string())
}

/// The `data-bytes` of every row of the site table's body.
fn table_rows(dom: &str) -> Vec<u64> {
    let table = &dom[dom.find("id=\"site-table\"").expect("a site table")..];
    let body = &table[table.find("<tbody>").expect("a table body")..];
    let body = &body[..body.find("</tbody>").expect("the body ends")];
    body.split("<tr ")
        .skip(1)
        .map(|row| {
            let v = row.find("data-bytes=\"").expect("rows carry bytes") + 12;
            row[v..v + row[v..].find('"').expect("quoted")]
                .parse()
                .expect("bytes are a number")
        })
        .collect()
}

#[test]
fn the_explorer_draws_each_shared_trace_in_chromium() {
    let Some(browser) = browser() else {
        skip_notice("chromium not installed: the HTML explorer's browser test did not run");
        return;
    };
    let root = workspace_root();
    let out = artefacts();
    let mut checked = 0;
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
        "hta_ddp_rank1_v100_profile_memory.trace.json.gz",
    ] {
        let Some(path) = shared_trace(&root, name) else {
            continue;
        };
        let snapshot = import::load(&path).expect("the shared traces load");
        check_page(&browser, &out, name, &snapshot);
        checked += 1;
    }
    if checked == 0 {
        skip_notice(
            "no shared trace found: the HTML explorer's browser test checked the planted run only",
        );
    }
    // A run made here, so that the page is checked on every machine with a browser.
    check_page(&browser, &out, "planted_leak.json", &planted_run());
}

/// A small training loop on the simulated device that keeps one block a step.
fn planted_run() -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let _weights = alloc.tagged("weights").alloc(64 << 20).unwrap();
    let mut kept = Vec::new();
    for _ in 0..12 {
        alloc.mark_step();
        let activations: Vec<_> = (0..4).map(|_| alloc.alloc(8 << 20).unwrap()).collect();
        kept.push(alloc.alloc(1 << 20).unwrap());
        drop(activations);
    }
    let snapshot = alloc.snapshot();
    drop(kept);
    snapshot
}

/// A fresh, empty browser profile folder under `out`.
fn tempdir(out: &Path, name: &str) -> PathBuf {
    let dir = out.join(format!("profile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a profile folder");
    dir
}

/// Renders `snapshot`'s report, loads it in `browser` and checks what a person would see.
fn check_page(browser: &Path, out: &Path, name: &str, snapshot: &Snapshot) {
    let built = report::build_report(snapshot, &report::ReportOptions::default());
    let data = built
        .timeline
        .explorer
        .clone()
        .expect("a built report carries the explorer's data");
    let peak = built.stats.peak_allocated_bytes;
    let stem = name.split('.').next().expect("a name");
    let page = out.join(format!("{stem}.html"));
    std::fs::write(&page, html::render_html(&built)).expect("the page is written");
    let profile = tempdir(out, stem);

    let dom = run_browser(browser, &page, "", &profile, &["--dump-dom"]);
    assert!(
        dom.contains("data-ready=\"1\""),
        "{name}: the script did not finish; errors: {:?}",
        attribute(&dom, "id=\"errors\"", "hidden")
    );
    let errors = &dom[dom.find("id=\"errors\"").expect("an error list")..];
    let errors = &errors[..errors.find("</ul>").expect("the list ends")];
    assert!(
        !errors.contains("<li"),
        "{name}: the page reported errors: {errors}"
    );
    let bands: usize = attribute(&dom, "id=\"band-count\"", "data-count")
        .expect("a band count")
        .parse()
        .expect("a number");
    assert_eq!(bands, data.series.len(), "{name}: bands drawn");
    assert!(bands >= 2, "{name}: at least two bands ({bands})");
    let drawn_peak: u64 = attribute(&dom, "id=\"peak-figure\"", "data-bytes")
        .expect("a peak figure")
        .parse()
        .expect("a number");
    assert_eq!(drawn_peak, peak, "{name}: the bands at the peak");
    let rows = table_rows(&dom);
    assert!(!rows.is_empty(), "{name}: the site table has rows");
    assert_eq!(
        rows.iter().sum::<u64>(),
        peak,
        "{name}: the site table at the peak"
    );
    let title = &dom[dom.find("id=\"table-title\"").expect("a table title")..];
    assert!(
        title[..title.find("</h3>").expect("the title ends")].contains("peak allocated"),
        "{name}: the table opens at the peak"
    );

    // Driven as a user would: E, P, the wheel, hover and click on a band, the arrows, a
    // finding, Esc and T, with the page's own self-test (`#selftest`).
    let profile = tempdir(out, &format!("{stem}-selftest"));
    let dom = run_browser(browser, &page, "selftest", &profile, &["--dump-dom"]);
    let errors = &dom[dom.find("id=\"errors\"").expect("an error list")..];
    let errors = &errors[..errors.find("</ul>").expect("the list ends")];
    assert!(
        !errors.contains("<li"),
        "{name}: driving the page raised errors: {errors}"
    );
    let got = |attr: &str| {
        attribute(&dom, "id=\"selftest\"", attr)
            .unwrap_or_else(|| panic!("{name}: the self-test did not record {attr}"))
    };
    assert_eq!(
        got("data-end-total"),
        built.stats.allocated_bytes.to_string(),
        "{name}: E shows the end, whose table sums to the end figure"
    );
    assert_eq!(got("data-peak-total"), peak.to_string(), "{name}: P");
    assert_eq!(got("data-zoomed"), "true", "{name}: the wheel zooms");
    let tip = got("data-tip");
    assert!(
        data.series.iter().any(|s| tip.starts_with(&s.label)),
        "{name}: hovering the bottom band at the peak names a band, not {tip:?}"
    );
    assert_ne!(got("data-pinned"), "-1", "{name}: a click pins the band");
    if !built.findings.is_empty() {
        assert_eq!(got("data-finding"), "0", "{name}: a finding is selected");
    }

    let shot = out.join(format!("{stem}.png"));
    let _ = std::fs::remove_file(&shot);
    let profile = tempdir(out, &format!("{stem}-shot"));
    run_browser(
        browser,
        &page,
        "",
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,900",
        ],
    );
    let png = std::fs::read(&shot).expect("a screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{name}: the screenshot is a picture"
    );
    eprintln!(
        "{name}: {bands} bands, peak {peak}; page and screenshot in {}",
        out.display()
    );
}
