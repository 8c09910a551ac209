//! Tests of the importers' front door: format sniffing, size limits, gzip.

use super::*;

#[test]
fn detects_formats_by_content() {
    assert_eq!(detect(b"\x80\x04N."), Some(Format::PytorchPickle));
    assert_eq!(
        detect(b" \n{\"format_version\": 1}"),
        Some(Format::VramscopeJson)
    );
    assert_eq!(detect(b"{\"traceEvents\": []}"), Some(Format::ChromeTrace));
    assert_eq!(detect(b"[{}]"), Some(Format::ChromeTrace));
    assert_eq!(detect(b"hello"), None);
    assert_eq!(detect(b""), None);
}

#[test]
fn unknown_content_is_named() {
    let e = load_bytes(b"GIF89a", "x.gif", &ImportOptions::default()).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("x.gif: "), "{text}");
    // What kind of content, never the content (issue 44).
    assert!(text.contains("text that is no JSON document"), "{text}");
    assert!(
        !text.contains("47 49 46") && !text.contains("GIF"),
        "{text}"
    );
    let e = load_bytes(b"", "empty", &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

/// `len` bytes of `fill` after `start`, made up as they are read, counting what was read.
struct Endless {
    start: Vec<u8>,
    fill: u8,
    len: u64,
    at: u64,
    read: u64,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.len - self.at) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let at = self.at as usize + i;
            *b = self.start.get(at).copied().unwrap_or(self.fill);
        }
        self.at += n as u64;
        self.read += n as u64;
        Ok(n)
    }
}

impl Seek for Endless {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        assert_eq!(to, SeekFrom::Start(0), "back to the start only");
        self.at = 0;
        Ok(0)
    }
}

fn endless(start: &[u8], fill: u8, len: u64) -> Endless {
    Endless {
        start: start.to_vec(),
        fill,
        len,
        at: 0,
        read: 0,
    }
}

#[test]
fn the_format_is_sniffed_from_the_first_bytes() {
    // 2 GB of zeros: refused after the first piece, with the words of a whole read.
    let mut zeros = endless(b"", 0, 2_000_000_000);
    let found = unknown_start(&mut zeros).expect("reads");
    assert_eq!(found.as_deref(), Some("it starts with zero bytes"));
    assert!(zeros.read <= SNIFF_BYTES, "read {} bytes", zeros.read);
    assert_eq!(zeros.at, 0, "left at the start");
    // Known starts go on to the importers, having read one piece.
    for start in [
        &b"\x80\x04"[..],
        b"\x1f\x8b",
        b"{\"a\"",
        b"\xef\xbb\xbf [",
        b"\n\n{",
    ] {
        let mut file = endless(start, b' ', 1 << 30);
        assert_eq!(unknown_start(&mut file).expect("reads"), None, "{start:?}");
        assert!(file.read <= SNIFF_BYTES);
    }
    // Whitespace before a JSON document is read past, piece by piece; whitespace to
    // the end is no document.
    let mut spaces = endless(b"", b' ', 3 * SNIFF_BYTES);
    assert_eq!(
        unknown_start(&mut spaces).expect("reads").as_deref(),
        Some("it starts with whitespace and no JSON document")
    );
    assert_eq!(
        unknown_start(&mut endless(b"", 0, 0))
            .expect("reads")
            .as_deref(),
        Some("the file is empty")
    );
}

#[test]
fn gzip_data_of_no_format_is_named_by_its_start() {
    let zeros = vec![0u8; 4 << 20];
    let options = ImportOptions::default();
    let plain = load_bytes(&zeros, "z", &options).expect_err("no format");
    let packed = load_bytes(&gzip(&zeros), "z", &options).expect_err("no format");
    assert_eq!(packed.to_string(), plain.to_string());
    assert!(
        packed.to_string().ends_with("it starts with zero bytes"),
        "{packed}"
    );
    // The size limit still comes first.
    let small = ImportOptions {
        max_decompressed_bytes: 1 << 20,
        ..ImportOptions::default()
    };
    let err = load_bytes(&gzip(&zeros), "z", &small).expect_err("too large");
    assert!(
        matches!(err.kind, ImportErrorKind::TooLarge { .. }),
        "{err}"
    );
}

#[test]
fn size_limits_apply() {
    let options = ImportOptions {
        max_file_bytes: 4,
        ..ImportOptions::default()
    };
    let e = load_bytes(b"\x80\x04N.xx", "big", &options).unwrap_err();
    assert!(matches!(
        e.kind,
        ImportErrorKind::TooLarge { what: "file", .. }
    ));

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &[b' '; 10_000]).unwrap();
    let packed = gz.finish().unwrap();
    let options = ImportOptions {
        max_decompressed_bytes: 1000,
        ..ImportOptions::default()
    };
    let e = load_bytes(&packed, "bomb.gz", &options).unwrap_err();
    assert!(matches!(
        e.kind,
        ImportErrorKind::TooLarge {
            what: "unpacked gzip data",
            ..
        }
    ));
    let e = load_bytes(
        &packed[..packed.len() / 2],
        "cut.gz",
        &ImportOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Gzip(_)), "{e}");
}

#[test]
fn format_detection_looks_at_each_byte_of_the_head_once() {
    // 4 MiB of whitespace arriving 8 KiB at a time, then an object: a rescan per piece
    // would look at 1 GiB.
    let mut content = vec![b' '; 4 << 20];
    content.extend_from_slice(b"{ \"traceEvents\": []}");
    let mut scan = HeadScan::default();
    let mut calls = 0;
    let mut len = 0;
    while !scan.decidable(&content[..len]) {
        calls += 1;
        len = (len + (8 << 10)).min(content.len());
    }
    assert_eq!(len, content.len());
    assert!(
        scan.examined <= content.len() + calls,
        "{} bytes looked at for {}",
        scan.examined,
        content.len()
    );
    // It decides as before on short heads.
    let decides = |head: &[u8]| HeadScan::default().decidable(head);
    assert!(!decides(b"  "));
    assert!(decides(b"\xef\xbb\xbf ["));
    assert!(!decides(b" { \"format_v"));
    assert!(decides(b" { \"format_version\""));
    assert!(decides(b"\x80\x04N."));
}

#[test]
fn deep_json_traces_are_errors_plain_and_gzipped() {
    let mut text = "[".repeat(200_000);
    text.push_str(&"]".repeat(200_000));
    let options = ImportOptions::default();
    for bytes in [text.as_bytes().to_vec(), gzip(text.as_bytes())] {
        let e = load_bytes(&bytes, "deep.json", &options).unwrap_err();
        assert!(
            matches!(
                e.kind,
                ImportErrorKind::TooDeep {
                    limit: 127,
                    line: 1,
                    column: 128
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("more than 127 levels"), "{e}");
    }
}

#[test]
fn own_snapshot_round_trips_in_either_key_order() {
    let snap = Snapshot::empty(
        vramscope_model::SnapshotSource::Vramscope,
        vramscope_model::DeviceInfo::default(),
    );
    let json = serde_json::to_vec(&snap).unwrap();
    let back = load_bytes(&json, "snap.json", &ImportOptions::default()).unwrap();
    assert_eq!(back, snap);
    // The same object with its keys sorted (`format_version` no longer first) still loads.
    let reordered: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(!serde_json::to_string(&reordered)
        .unwrap()
        .starts_with("{\"format_version\""));
    let json = serde_json::to_vec(&reordered).unwrap();
    let back = load_bytes(&json, "snap.json", &ImportOptions::default()).unwrap();
    assert_eq!(back, snap);
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, bytes).unwrap();
    gz.finish().unwrap()
}

const TRACE: &str = r#"{"traceEvents": [
    {"ph": "X", "name": "ProfilerStep#1", "ts": 1, "dur": 9},
    {"ph": "i", "name": "[memory]", "ts": 2, "args": {"Device Type": 1, "Device Id": 0,
     "Addr": 4096, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152}},
    {"ph": "i", "name": "[memory]", "ts": 3, "args": {"Device Type": 1, "Device Id": 0,
     "Addr": 4096, "Bytes": -512, "Total Allocated": 0, "Total Reserved": 2097152}}]}"#;

#[test]
fn gzipped_chrome_traces_stream_to_the_same_snapshot() {
    let options = ImportOptions::default();
    let plain = load_bytes(TRACE.as_bytes(), "t.json", &options).unwrap();
    assert_eq!(plain.events.len(), 2);
    assert_eq!(
        load_bytes(&gzip(TRACE.as_bytes()), "t.json.gz", &options).unwrap(),
        plain
    );
    // Whitespace longer than the first piece unpacked still leaves the format to detect.
    let padded = format!("{}{TRACE}\n", " ".repeat(20_000));
    assert_eq!(
        load_bytes(&gzip(padded.as_bytes()), "p.json.gz", &options).unwrap(),
        plain
    );
    // The same through a file, whose bytes are handed over and freed early.
    let path =
        std::env::temp_dir().join(format!("vramscope-import-{}.json.gz", std::process::id()));
    std::fs::write(&path, gzip(TRACE.as_bytes())).unwrap();
    let loaded = load(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap(), plain);
}

#[test]
fn gzipped_chrome_trace_problems_are_named() {
    let options = ImportOptions::default();
    // Malformed JSON is a JSON error with its line and column.
    let e = load_bytes(&gzip(b"{\"traceEvents\": [,]}"), "bad.json.gz", &options).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Json(_)), "{e}");
    assert!(e.to_string().contains("line 1 column"), "{e}");
    let e = load_bytes(&gzip(b"[{}] x"), "tail.json.gz", &options).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Json(_)), "{e}");
    // Cut gzip data is a gzip error, even where the JSON read so far is fine.
    let packed = gzip(TRACE.as_bytes());
    let e = load_bytes(&packed[..packed.len() - 6], "cut.json.gz", &options).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Gzip(_)), "{e}");
    // Too much unpacked data is a size error, however early the JSON goes wrong.
    let small = ImportOptions {
        max_decompressed_bytes: 100,
        ..ImportOptions::default()
    };
    let e = load_bytes(&packed, "big.json.gz", &small).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ImportErrorKind::TooLarge {
                what: "unpacked gzip data",
                limit: 100,
                size: None
            }
        ),
        "{e}"
    );
    let broken = format!("[,]{}", " ".repeat(200));
    let e = load_bytes(&gzip(broken.as_bytes()), "both.json.gz", &small).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::TooLarge { .. }), "{e}");
    // Exactly at the limit is fine.
    let exact = ImportOptions {
        max_decompressed_bytes: TRACE.len() as u64,
        ..ImportOptions::default()
    };
    assert!(load_bytes(&packed, "exact.json.gz", &exact).is_ok());
}

#[test]
fn a_gzipped_run_of_marks_is_refused_without_unpacking_it() {
    // D7 of issue 33: `PROTO 4` and 960 MiB of MARKs, as concatenated gzip members (one
    // member of 1 MiB of MARKs compressed once and repeated), 1 MB of gzip data.
    let mib = vec![b'('; 1 << 20];
    let mut first = vec![0x80, 4];
    first.extend_from_slice(&mib);
    let mut bytes = gzip(&first);
    let member = gzip(&mib);
    for _ in 1..960 {
        bytes.extend_from_slice(&member);
    }
    let options = ImportOptions::default();
    let unpacked = std::cell::Cell::new(0);
    let started = std::time::Instant::now();
    let e = pickle_from_gzip(&bytes, "marks.pickle.gz", &options, &unpacked).unwrap_err();
    let ImportErrorKind::Pickle(pickle) = &e.kind else {
        panic!("{e}");
    };
    assert_eq!(pickle.offset, 202, "{e}");
    assert!(e.to_string().contains("MARKs open at once"), "{e}");
    // A piece for the streaming read, one for the whole-document read that names the
    // error: a few MiB of the 960.
    assert!(
        unpacked.get() <= 4 << 20,
        "{} bytes unpacked",
        unpacked.get()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    // The same error through the front door.
    let e = load_bytes(&bytes, "marks.pickle.gz", &options).unwrap_err();
    assert!(e.to_string().contains("MARKs open at once"), "{e}");

    // Gzip data that goes wrong before the pickle does is reported as such: a pickle
    // missing its STOP, then a corrupt member.
    let mut corrupt = gzip(b"\x80\x04]\x94(K\x01K\x02");
    corrupt.extend_from_slice(&member[..member.len() / 2]);
    let e = load_bytes(&corrupt, "corrupt.pickle.gz", &options).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Gzip(_)), "{e}");
    // And data past the size limit, as the limit.
    let small = ImportOptions {
        max_decompressed_bytes: 1 << 20,
        ..ImportOptions::default()
    };
    let mut big = gzip(b"\x80\x04]\x94(");
    for _ in 0..3 {
        big.extend_from_slice(&gzip(&vec![b'K'; 1 << 19]));
    }
    let e = load_bytes(&big, "big.pickle.gz", &small).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::TooLarge { .. }), "{e}");
}

#[test]
fn gzipped_own_snapshot_loads_in_either_key_order() {
    let snap = Snapshot::empty(
        vramscope_model::SnapshotSource::Vramscope,
        vramscope_model::DeviceInfo::default(),
    );
    let json = serde_json::to_vec(&snap).unwrap();
    let options = ImportOptions::default();
    assert_eq!(
        load_bytes(&gzip(&json), "s.json.gz", &options).unwrap(),
        snap
    );
    let reordered: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let json = serde_json::to_vec(&reordered).unwrap();
    assert_eq!(
        load_bytes(&gzip(&json), "s.json.gz", &options).unwrap(),
        snap
    );
    // An empty gzip member unpacks to an empty file.
    let e = load_bytes(&gzip(b""), "empty.gz", &options).unwrap_err();
    assert!(e.to_string().contains("the file is empty"), "{e}");
}

/// Issue 44: an error about a file of no known format says what kind of content it is, never
/// the content: a link in a `ranks` folder to `/proc/self/environ` or a key file once had its
/// first eight bytes printed in hex.
#[test]
fn an_unknown_format_is_described_without_its_content() {
    let options = ImportOptions::default();
    for (content, words) in [
        (&b"SECRET_TOKEN=hunter2\0PATH=/usr/bin\0"[..], "binary data"),
        (
            b"SECRET_TOKEN=hunter2\nPATH=/usr/bin\n",
            "text that is no JSON document",
        ),
        (b"PK\x03\x04SECRET", "a ZIP archive"),
        (b"\xde\xad\xbe\xefSECRET", "binary data"),
    ] {
        for data in [content.to_vec(), gzip(content)] {
            let e = load_bytes(&data, "rank0.json", &options).expect_err("no format");
            let text = e.to_string();
            assert!(text.contains(words), "{text}");
            for leak in ["SECRET", "hunter2", "53 45", "PATH", "de ad"] {
                assert!(!text.contains(leak), "{leak} in {text}");
            }
        }
    }
}

/// Issue 44: a FIFO with no writer (which blocked `vramscope report` and `vramscope.load()` for
/// ever), a device and a directory are refused before they are opened, saying what they are.
#[test]
#[cfg(unix)]
fn what_is_not_a_regular_file_is_refused_saying_what_it_is() {
    let dir = std::env::temp_dir().join(format!("vramscope-not-a-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("trace.pickle");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    let mut cases = vec![
        ("/dev/zero".into(), "a device"),
        (dir.clone(), "a directory"),
    ];
    if made.is_ok_and(|s| s.success()) {
        cases.push((fifo, "a FIFO (named pipe)"));
    }
    for (path, kind) in cases {
        let e = load(&path).expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains(&format!("not a regular file but {kind}")),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
