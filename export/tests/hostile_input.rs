//! Memory and time bombs for the importers (issue 17): small files that used to make an
//! import take gigabytes or minutes. Each test builds its input here (nothing binary is
//! committed) and asserts on what the import produced or the error it gave, never on time:
//! where the bomb was quadratic, the input is large enough that the quadratic code would take
//! minutes, while the linear code takes a fraction of a second even in a debug build.

use std::io::Write;

use vramscope_import::{self as import, ImportError, ImportErrorKind, ImportOptions};
use vramscope_model::Snapshot;
use vramscope_pickle::PickleErrorKind;

fn load(bytes: &[u8], origin: &str) -> Result<Snapshot, ImportError> {
    import::load_bytes(bytes, origin, &ImportOptions::default())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A minimal protocol-4 pickle writer: just the opcodes these tests need, with the memo
/// numbered as `MEMOIZE` numbers it.
struct Pickle {
    bytes: Vec<u8>,
    memo: u32,
}

impl Pickle {
    fn new() -> Pickle {
        Pickle {
            bytes: b"\x80\x04".to_vec(),
            memo: 0,
        }
    }

    fn op(&mut self, bytes: &[u8]) -> &mut Pickle {
        self.bytes.extend_from_slice(bytes);
        self
    }

    fn str(&mut self, text: &str) -> &mut Pickle {
        self.bytes.push(b'X');
        self.bytes
            .extend_from_slice(&(text.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(text.as_bytes());
        self
    }

    fn int(&mut self, v: i32) -> &mut Pickle {
        self.bytes.push(b'J');
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn float(&mut self, v: f64) -> &mut Pickle {
        self.bytes.push(b'G');
        self.bytes.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// Memoizes the value on top of the stack and returns its memo index.
    fn memoize(&mut self) -> u32 {
        self.bytes.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, index: u32) -> &mut Pickle {
        self.bytes.push(b'j');
        self.bytes.extend_from_slice(&index.to_le_bytes());
        self
    }

    fn stop(&mut self) -> Vec<u8> {
        self.bytes.push(b'.');
        std::mem::take(&mut self.bytes)
    }
}

/// A snapshot pickle `{'segments': [], 'device_traces': [[entries...]], 'allocator_settings':
/// settings}`, with `entries` and `settings` written by the closures.
fn snapshot(entries: impl FnOnce(&mut Pickle), settings: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    let mut p = Pickle::new();
    p.op(b"}(").str("segments").op(b"]").str("device_traces");
    p.op(b"](](");
    entries(&mut p);
    p.op(b"eeu");
    p.str("allocator_settings");
    settings(&mut p);
    p.op(b"s");
    p.stop()
}

/// Writes the start of a trace entry `{'action': 'alloc', 'addr': addr, 'size': 512,
/// 'frames': ` (the caller writes the frames and closes it with [`end_entry`]).
fn begin_entry(p: &mut Pickle, addr: i32) {
    p.op(b"}(")
        .str("action")
        .str("alloc")
        .str("addr")
        .int(addr)
        .str("size")
        .int(512)
        .str("frames");
}

fn end_entry(p: &mut Pickle) {
    p.op(b"u");
}

/// Writes a frame dict `{'filename': file, 'line': line, 'name': 'f'}`, `file` being a
/// memo index.
fn frame(p: &mut Pickle, file: u32, line: i32) {
    p.op(b"}(")
        .str("filename")
        .get(file)
        .str("line")
        .int(line)
        .str("name")
        .str("f")
        .op(b"u");
}

/// The bytes of text and frames in a snapshot's call sites.
fn site_bytes(s: &Snapshot) -> usize {
    s.sites
        .iter()
        .flat_map(|site| &site.frames)
        .map(|f| f.file.len() + f.function.len())
        .sum()
}

#[test]
fn a_frame_dict_shared_by_every_frame_of_a_stack_is_not_copied_per_reference() {
    // One 1 KiB frame dict, memoized, referenced 200,000 times from one frames list (the
    // issue's file: 10 KB and a million times, 7.5 KB gzipped). Copying the frame per
    // reference made 10 GB; a call site keeps its innermost 4096 frames.
    const REFERENCES: usize = 200_000;
    let bytes = snapshot(
        |p| {
            let file = p.str(&"f".repeat(1024)).memoize();
            // The string stays in the memo only.
            p.op(b"0");
            begin_entry(p, 4096);
            p.op(b"](");
            frame(p, file, 7);
            let dict = p.memoize();
            for _ in 1..REFERENCES {
                p.get(dict);
            }
            p.op(b"e");
            end_entry(p);
        },
        |p| {
            p.op(b"}");
        },
    );
    let packed = gzip(&bytes);
    assert!(packed.len() < 20_000, "{} bytes gzipped", packed.len());
    let s = load(&packed, "shared-frame.pickle.gz").unwrap();
    assert_eq!(s.events.len(), 1);
    assert_eq!(s.sites.len(), 1);
    let frames = &s.sites[0].frames;
    assert_eq!(frames.len(), 4097, "4096 innermost frames and a note");
    assert_eq!(frames[0].line, 7);
    let note = &frames[4096].function;
    assert!(note.contains("195904 outer frames left out"), "{note}");
    assert!(site_bytes(&s) < 8 << 20, "{} bytes", site_bytes(&s));
}

#[test]
fn stacks_that_would_copy_more_than_the_limit_are_an_error() {
    // A 300 KiB file name in a frame shared 4096 times by one stack: 1.2 GiB of copies.
    let bytes = snapshot(
        |p| {
            let file = p.str(&"d/".repeat(150 << 10)).memoize();
            // The string stays in the memo only.
            p.op(b"0");
            begin_entry(p, 4096);
            p.op(b"](");
            frame(p, file, 1);
            let dict = p.memoize();
            for _ in 1..4096 {
                p.get(dict);
            }
            p.op(b"e");
            end_entry(p);
        },
        |p| {
            p.op(b"}");
        },
    );
    let e = load(&bytes, "wide.pickle").unwrap_err();
    match &e.kind {
        ImportErrorKind::Structure { path, message } => {
            assert_eq!(path, "device_traces[0][0].frames");
            let limit_mib = ((64 << 20) + 8 * bytes.len()) >> 20;
            assert!(
                message.contains(&format!("more than {limit_mib} MiB of frames")),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn frame_dicts_that_share_their_strings_are_read_once() {
    // 30,000 frame dicts, each its own object but all with one 2 MiB file name: copying and
    // hashing the name per dict made 60 GB of work.
    let bytes = snapshot(
        |p| {
            let file = p.str(&"g".repeat(2 << 20)).memoize();
            // The string stays in the memo only.
            p.op(b"0");
            for i in 0..30_000 {
                begin_entry(p, 4096 + 512 * i);
                p.op(b"](");
                frame(p, file, 3);
                p.op(b"e");
                end_entry(p);
            }
        },
        |p| {
            p.op(b"}");
        },
    );
    let s = load(&bytes, "shared-name.pickle").unwrap();
    assert_eq!(s.events.len(), 30_000);
    assert_eq!(s.sites.len(), 1);
    assert_eq!(s.sites[0].frames.len(), 1);
    assert!(s.events.iter().all(|e| e.site() == Some(0)));
}

#[test]
fn a_long_run_of_marks_is_a_limit_error() {
    // 10 MiB of MARKs (the issue's file: 979 KB gzipped, a GiB unpacked, which asked for one
    // 8 GiB allocation): open MARKs are bounded by the nesting limit.
    let mut bytes = b"\x80\x04".to_vec();
    bytes.resize(10 << 20, b'(');
    bytes.push(b'.');
    let e = load(&gzip(&bytes), "marks.pickle.gz").unwrap_err();
    let text = e.to_string();
    match e.kind {
        ImportErrorKind::Pickle(p) => {
            assert_eq!(p.offset, 202);
            assert_eq!(
                p.kind,
                PickleErrorKind::LimitExceeded {
                    what: "MARKs open at once (levels of nesting)",
                    limit: 200
                }
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(text.contains("byte offset 202"), "{text}");
}

#[test]
fn a_memoized_list_referenced_many_times_is_converted_once() {
    // allocator_settings = {'x': [l] * 100000} with l a memoized list of 100,000 elements:
    // hashing l once per reference made 1e10 steps.
    const N: usize = 100_000;
    let bytes = snapshot(
        |_| {},
        |p| {
            p.op(b"}").str("x").op(b"](");
            p.op(b"](");
            for _ in 0..N {
                p.op(b"N");
            }
            p.op(b"e");
            let list = p.memoize();
            for _ in 1..N {
                p.get(list);
            }
            p.op(b"es");
        },
    );
    let s = load(&bytes, "settings.pickle").unwrap();
    assert!(s.events.is_empty());
    // The reader's own value tree shares the list among all references.
    let v = vramscope_pickle::parse(&bytes).unwrap();
    let x = v.get("allocator_settings").unwrap().get("x").unwrap();
    let refs = x.as_seq().unwrap();
    assert_eq!(refs.len(), N);
    assert!(refs.iter().all(|l| l.identity() == refs[0].identity()));
    assert_eq!(refs[N - 1].as_seq().unwrap().len(), N);
}

#[test]
fn a_decimal_integer_of_too_many_digits_is_refused_where_it_stands() {
    // INT with 100,000 digits: decimal parsing was quadratic in the digits (a million took two
    // minutes). Python itself refuses more than 4300 digits.
    let mut at = 0;
    let bytes = snapshot(
        |_| {},
        |p| {
            p.op(b"}").str("big");
            at = p.bytes.len();
            p.op(b"I").op("7".repeat(100_000).as_bytes()).op(b"\ns");
        },
    );
    let e = load(&gzip(&bytes), "digits.pickle.gz").unwrap_err();
    let text = e.to_string();
    assert!(text.len() < 300, "the error quotes no digits: {text}");
    match e.kind {
        ImportErrorKind::Pickle(p) => {
            assert_eq!(p.offset, at);
            match p.kind {
                PickleErrorKind::BadArgument { opcode, reason } => {
                    assert_eq!(opcode, "INT");
                    assert!(reason.contains("100000 decimal digits"), "{reason}");
                    assert!(reason.contains("more than 4300"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    // 4300 digits are read, as Python reads them.
    let bytes = snapshot(
        |_| {},
        |p| {
            p.op(b"}").str("big");
            p.op(b"I").op("7".repeat(4300).as_bytes()).op(b"\ns");
        },
    );
    let v = vramscope_pickle::parse(&bytes).unwrap();
    let big = v.get("allocator_settings").unwrap().get("big").unwrap();
    assert_eq!(big.type_name(), "int");
    assert!(load(&bytes, "fits.pickle").is_ok());
}

#[test]
fn a_dict_of_many_float_keys_is_read_in_linear_time() {
    // 100,000 distinct float keys and one repeated: a linear search per key made 5e9 steps.
    const N: usize = 100_000;
    let bytes = snapshot(
        |_| {},
        |p| {
            p.op(b"}(");
            for i in 0..N {
                p.float(i as f64 + 0.5).int(i as i32);
            }
            p.float(0.5).int(-1);
            p.op(b"u");
        },
    );
    assert!(load(&bytes, "floats.pickle").is_ok());
    let v = vramscope_pickle::parse(&bytes).unwrap();
    let pairs = v.get("allocator_settings").unwrap().as_dict().unwrap();
    assert_eq!(pairs.len(), N);
    assert_eq!(
        pairs[0].1.as_i64(),
        Some(-1),
        "the last value of a key wins"
    );
    assert_eq!(pairs[N - 1].1.as_i64(), Some(N as i64 - 1));
}

#[test]
fn leading_whitespace_in_gzip_data_is_scanned_once() {
    // 16 MiB of whitespace before a Chrome trace: format detection looked at the whole head
    // again for every 8 KiB unpacked (16 GiB of looking; 32 MiB took 33 s in a release build).
    let trace = br#"{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 2, "args":
        {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 512}}]}"#;
    let mut content = vec![b' '; 16 << 20];
    content.extend_from_slice(trace);
    let packed = gzip(&content);
    assert!(packed.len() < 100_000, "{} bytes gzipped", packed.len());
    let s = load(&packed, "padded.json.gz").unwrap();
    assert_eq!(s.events.len(), 1);
    assert_eq!(s.events[0].size, 512);
}

#[test]
fn json_nested_a_million_deep_is_an_error_naming_the_limit() {
    // It was accepted as an empty Chrome trace.
    let mut deep = vec![b'['; 1_000_000];
    deep.extend(std::iter::repeat_n(b']', 1_000_000));
    for (bytes, origin) in [(deep.clone(), "deep.json"), (gzip(&deep), "deep.json.gz")] {
        let e = load(&bytes, origin).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e.kind,
                ImportErrorKind::TooDeep {
                    limit: 127,
                    line: 1,
                    column: 128
                }
            ),
            "{text}"
        );
        assert!(text.starts_with(origin), "{text}");
        assert!(text.contains("nested too deep"), "{text}");
        assert!(text.contains("more than 127 levels"), "{text}");
    }
    // The same as the list of events, or in an event.
    for (prefix, suffix) in [
        (r#"{"traceEvents": "#, "}"),
        (r#"{"traceEvents": [{"name": "#, "}]}"),
    ] {
        let mut bytes = prefix.as_bytes().to_vec();
        bytes.extend_from_slice(&deep);
        bytes.extend_from_slice(suffix.as_bytes());
        let e = load(&bytes, "deep-events.json").unwrap_err();
        assert!(matches!(e.kind, ImportErrorKind::TooDeep { .. }), "{e}");
    }
}

/// Opens `{'device_traces': [], 'segments': [` (the caller writes the segments and closes
/// both with `eu`).
fn open_segments(p: &mut Pickle) {
    p.op(b"}(")
        .str("device_traces")
        .op(b"]")
        .str("segments")
        .op(b"](");
}

/// Opens `{'segments': [], 'device_traces': [], 'external_annotations': [` (the caller writes
/// the annotations and closes both with `eu`).
fn open_annotations(p: &mut Pickle) {
    p.op(b"}(")
        .str("segments")
        .op(b"]")
        .str("device_traces")
        .op(b"]")
        .str("external_annotations")
        .op(b"](");
}

/// Writes a block dict `{'address': address, 'size': size, 'requested_size': size, 'state':
/// 'active_allocated'}`.
fn block(p: &mut Pickle, address: i32, size: i32) {
    p.op(b"}(")
        .str("address")
        .int(address)
        .str("size")
        .int(size)
        .str("requested_size")
        .int(size)
        .str("state")
        .str("active_allocated")
        .op(b"u");
}

/// Opens a segment dict of 2 MiB at `address` on device 0, up to its `blocks` key (the caller
/// writes the blocks and closes the dict with `u`).
fn begin_segment(p: &mut Pickle, address: i32) {
    p.op(b"}(")
        .str("device")
        .int(0)
        .str("address")
        .int(address)
        .str("total_size")
        .int(2 << 20)
        .str("stream")
        .int(0)
        .str("segment_type")
        .str("large");
}

fn structure_error(bytes: &[u8]) -> (String, String) {
    match load(bytes, "hostile.pickle").unwrap_err().kind {
        ImportErrorKind::Structure { path, message } => (path, message),
        other => panic!("expected a structure error, got {other:?}"),
    }
}

#[test]
fn segments_that_share_one_list_of_blocks_many_times_are_refused() {
    // One segment dict listed 20,000 times, its blocks one block dict listed 20,000 times:
    // 4e8 blocks from 80 KB, which the importer made one by one (gigabytes, minutes) and the
    // PyTorch export then wrote out (4.5 GB from a 40 KB file).
    let mut p = Pickle::new();
    open_segments(&mut p);
    begin_segment(&mut p, 1 << 30);
    p.str("blocks").op(b"](");
    block(&mut p, 1 << 30, 512);
    let shared_block = p.memoize();
    for _ in 1..20_000 {
        p.get(shared_block);
    }
    p.op(b"eu");
    let shared_segment = p.memoize();
    for _ in 1..20_000 {
        p.get(shared_segment);
    }
    p.op(b"eu");
    let bytes = p.stop();
    let (path, message) = structure_error(&bytes);
    assert_eq!(path, "segments");
    assert!(
        message.starts_with("20000 segments and 400000000 blocks in a"),
        "{message}"
    );
    assert!(
        message.contains("share dicts through the memo"),
        "{message}"
    );
}

#[test]
fn blocks_that_overlap_or_leave_their_segment_are_an_error_naming_the_segment() {
    let one_segment = |blocks: &dyn Fn(&mut Pickle)| {
        let mut p = Pickle::new();
        open_segments(&mut p);
        begin_segment(&mut p, 1 << 30);
        p.str("blocks").op(b"](");
        blocks(&mut p);
        p.op(b"eueu");
        p.stop()
    };
    // The same block listed twice counted its bytes twice in every figure.
    let (path, message) = structure_error(&one_segment(&|p| {
        block(p, 1 << 30, 4096);
        block(p, (1 << 30) + 2048, 4096);
    }));
    assert_eq!(path, "segments[0].blocks");
    assert!(
        message.contains("the block at 0x40000800 (4096 bytes) overlaps the block before it"),
        "{message}"
    );
    let (path, message) = structure_error(&one_segment(&|p| block(p, (1 << 30) - 512, 4096)));
    assert_eq!(path, "segments[0].blocks");
    assert!(message.contains("lies outside its segment"), "{message}");
    // Blocks in another order are sorted first: tiling blocks are fine.
    let fine = one_segment(&|p| {
        block(p, (1 << 30) + 4096, 4096);
        block(p, 1 << 30, 4096);
    });
    let s = load(&fine, "fine.pickle").unwrap();
    assert_eq!(s.segments[0].blocks.len(), 2);
}

#[test]
fn segments_that_overlap_are_an_error_naming_the_later_one() {
    let mut p = Pickle::new();
    open_segments(&mut p);
    for address in [(1 << 30) + (1 << 20), 1 << 30] {
        begin_segment(&mut p, address);
        p.str("blocks").op(b"]u");
    }
    p.op(b"eu");
    let (path, message) = structure_error(&p.stop());
    // Sorted by address, the segment of the file's first place is the one that overlaps.
    assert_eq!(path, "segments[0].address");
    assert!(
        message.contains("overlaps segments[1] (0x40000000 to 0x40200000) on device 0"),
        "{message}"
    );
}

#[test]
fn keys_a_file_repeats_are_exported_once() {
    // `device_traces` set 20,000 times to one trace of 2,000 entries, and a segment whose
    // `blocks` is set 20,000 times: Python keeps one of each, and the export wrote the trace
    // 20,000 times (40 million entries) and the blocks as often.
    let mut p = Pickle::new();
    p.op(b"](");
    for i in 0..2_000 {
        begin_entry(&mut p, (1 << 30) + 512 * i);
        p.op(b"]");
        end_entry(&mut p);
    }
    p.op(b"e");
    let trace = p.memoize();
    p.op(b"0");
    p.op(b"](");
    for i in 0..64 {
        block(&mut p, (1 << 29) + 4096 * i, 4096);
    }
    p.op(b"e");
    let blocks = p.memoize();
    p.op(b"0");
    p.op(b"}(").str("segments").op(b"](");
    begin_segment(&mut p, 1 << 29);
    for _ in 0..20_000 {
        p.str("blocks").get(blocks);
    }
    p.op(b"ue");
    p.str("device_traces").op(b"](");
    p.get(trace);
    p.op(b"e");
    let traces = p.memoize();
    for _ in 1..20_000 {
        p.str("device_traces").get(traces);
    }
    p.op(b"u");
    let bytes = p.stop();

    let snapshot = load(&bytes, "repeated.pickle").unwrap();
    let doc = vramscope_pickle::Document::parse(&bytes).unwrap();
    let extras = vramscope_export::PytorchExtras::from_document(&doc).unwrap();
    let exported = vramscope_export::to_pytorch_pickle_with(&snapshot, Some(&extras)).unwrap();
    assert!(
        exported.len() < bytes.len(),
        "{} bytes exported from {}",
        exported.len(),
        bytes.len()
    );
    let again = load(&exported, "exported.pickle").unwrap();
    assert_eq!(again.events.len(), snapshot.events.len());
    assert_eq!(again.segments[0].blocks.len(), 64);
}

#[test]
fn a_trace_whose_live_blocks_overlap_is_not_exported_as_a_snapshot_that_cannot_import() {
    // Two live allocations over the same bytes: the export made one segment holding both
    // blocks, a pickle the importer refuses (and PyTorch's viewer would count twice).
    let bytes = snapshot(
        |p| {
            for addr in [1 << 30, (1 << 30) + 256] {
                begin_entry(p, addr);
                p.op(b"]");
                end_entry(p);
            }
        },
        |p| {
            p.op(b"}");
        },
    );
    let snapshot = load(&bytes, "overlap.pickle").unwrap();
    let e = vramscope_export::to_pytorch_pickle(&snapshot).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("overlaps"), "{text}");
    assert!(text.contains("the trace is inconsistent"), "{text}");
}

#[test]
fn annotations_that_share_one_dict_many_times_are_refused() {
    // One annotation dict listed 200,000 times in 400 KB: each became a step of its own
    // (135 MB for a 1 MB file).
    let mut p = Pickle::new();
    open_annotations(&mut p);
    p.op(b"}(")
        .str("device")
        .int(0)
        .str("name")
        .str("step")
        .str("stage")
        .str("START")
        .str("time_us")
        .int(5)
        .op(b"u");
    let shared = p.memoize();
    for _ in 1..200_000 {
        p.get(shared);
    }
    p.op(b"eu");
    let (path, message) = structure_error(&p.stop());
    assert_eq!(path, "external_annotations");
    assert!(message.starts_with("200000 annotations in a"), "{message}");
}

#[test]
fn a_device_past_the_device_limit_is_an_error_naming_the_field() {
    // A 208-byte pickle with one segment on device 4,000,000,000 made the PyTorch export ask
    // for 96 GB (a list per device up to it), and 40,000 device traces sharing one entry made
    // `report` take 28 s for 200 KB (the whole snapshot copied per device).
    let mut p = Pickle::new();
    open_segments(&mut p);
    p.op(b"}(")
        .str("device")
        .op(b"\x8a\x05\x00\x28\x6b\xee\x00"); // LONG1 4e9
    p.str("address")
        .int(1 << 30)
        .str("total_size")
        .int(2 << 20)
        .str("blocks")
        .op(b"]u");
    p.op(b"eu");
    let (path, message) = structure_error(&p.stop());
    assert_eq!(path, "segments[0].device");
    assert!(
        message.starts_with("device 4000000000 is out of range: device indices run from 0 to 255"),
        "{message}"
    );

    // An entry in the trace at position 256.
    let mut p = Pickle::new();
    p.op(b"}(")
        .str("segments")
        .op(b"]")
        .str("device_traces")
        .op(b"](");
    p.op(b"]");
    let empty = p.memoize();
    for _ in 1..256 {
        p.get(empty);
    }
    p.op(b"](");
    begin_entry(&mut p, 1 << 30);
    p.op(b"]");
    end_entry(&mut p);
    p.op(b"eeu");
    let (path, message) = structure_error(&p.stop());
    assert_eq!(path, "device_traces[256]");
    assert!(
        message.starts_with("device 256 is out of range"),
        "{message}"
    );

    // vramscope's own JSON, whatever field names the device: a segment's is checked after
    // reading, with its path; an event's as it is read (an event holds its device in two
    // bytes), in the same words, with the line and column.
    let mut snapshot = vramscope_testkit::device_run(0, 1 << 20);
    snapshot.segments[0].device = 4_000_000_000;
    let json = serde_json::to_vec(&snapshot).unwrap();
    let (path, message) = structure_error(&json);
    assert_eq!(path, "segments[0].device");
    assert!(
        message.starts_with("device 4000000000 is out of range"),
        "{message}"
    );
    let snapshot = vramscope_testkit::device_run(0, 1 << 20);
    for device in [4_000_000_000u64, 70_000, 300] {
        let mut value = serde_json::to_value(&snapshot).unwrap();
        value["events"][3]["device"] = device.into();
        let json = serde_json::to_vec(&value).unwrap();
        let error = load(&json, "hostile.json").unwrap_err().to_string();
        assert!(
            error.contains(&format!("device {device} is out of range")),
            "{error}"
        );
        assert!(error.contains("line 1 column"), "{error}");
    }
}

/// An event keeps its step in four bytes: vramscope's JSON with a step past them is refused
/// as it is read, in the one sentence every reader uses, with the line and column.
#[test]
fn an_event_step_past_four_bytes_is_refused() {
    let snapshot = vramscope_testkit::device_run(0, 1 << 20);
    let mut value = serde_json::to_value(&snapshot).unwrap();
    value["events"][3]["step"] = (1u64 << 32).into();
    let json = serde_json::to_vec(&value).unwrap();
    let error = load(&json, "hostile.json").unwrap_err().to_string();
    assert!(
        error.contains(&vramscope_model::step_refusal(1 << 32)),
        "{error}"
    );
    assert!(error.contains("line 1 column"), "{error}");
    value["events"][3]["step"] = u32::MAX.into();
    let json = serde_json::to_vec(&value).unwrap();
    let back: vramscope_model::Snapshot = serde_json::from_slice(&json).unwrap();
    assert_eq!(back.events[3].step, u32::MAX);
}

/// An event's call site, tag and scope are kept in four bytes that cannot hold `u32::MAX`:
/// vramscope's JSON that names it is refused as it is read, with the line and column, and the
/// largest index that fits reads back as written.
#[test]
fn an_event_table_index_past_the_largest_is_refused() {
    let snapshot = vramscope_testkit::device_run(0, 1 << 20);
    for field in ["site", "tag", "scope"] {
        let mut value = serde_json::to_value(&snapshot).unwrap();
        value["events"][3][field] = u32::MAX.into();
        let json = serde_json::to_vec(&value).unwrap();
        let error = load(&json, "hostile.json").unwrap_err().to_string();
        assert!(
            error.contains("the index 4294967295 is past the largest a table can have"),
            "{field}: {error}"
        );
        assert!(error.contains("line 1 column"), "{field}: {error}");

        value["events"][3][field] = (u32::MAX - 1).into();
        let json = serde_json::to_vec(&value).unwrap();
        let back: vramscope_model::Snapshot = serde_json::from_slice(&json).unwrap();
        let e = &back.events[3];
        let read = match field {
            "site" => e.site(),
            "tag" => e.tag(),
            _ => e.scope(),
        };
        assert_eq!(read, Some(u32::MAX - 1), "{field}");
    }
}

/// A snapshot of `stacks` allocations, each with a stack of one frame at its own line in
/// one 90 KB file name that the pickle memoizes once.
fn stacks_sharing_a_long_file_name(stacks: i32) -> Vec<u8> {
    snapshot(
        |p| {
            let file = p.str(&"f/".repeat(45_000)).memoize();
            p.op(b"0");
            for i in 0..stacks {
                begin_entry(p, (1 << 20) + 512 * i);
                p.op(b"](");
                frame(p, file, i);
                p.op(b"e");
                end_entry(p);
            }
        },
        |p| {
            p.op(b"}");
        },
    )
}

#[test]
fn a_long_file_name_shared_by_many_call_sites_is_held_to_the_file_size() {
    // 5,000 stacks: 450 MB of copies from 345 KB (report took 15 s and 3.1 GB), under the
    // fixed 1 GiB bound.
    let bytes = stacks_sharing_a_long_file_name(5_000);
    let text = load(&bytes, "long-name.pickle").unwrap_err().to_string();
    assert!(
        text.contains("of frames (the limit for this file"),
        "{text}"
    );
    // A site table of the same file names, within the bound, still loads.
    let fits = stacks_sharing_a_long_file_name(100);
    assert_eq!(load(&fits, "fits.pickle").unwrap().sites.len(), 100);
}

#[test]
fn a_long_name_shared_by_many_annotations_is_held_to_the_file_size() {
    // One 100 KB annotation name, memoized, in 20,000 annotations: 2 GB of copies (5.9 GB at
    // the peak of `report`) from 520 KB.
    let mut p = Pickle::new();
    open_annotations(&mut p);
    let name = p.str(&"n".repeat(100_000)).memoize();
    p.op(b"0");
    for i in 0..20_000 {
        p.op(b"}(")
            .str("device")
            .int(0)
            .str("name")
            .get(name)
            .str("stage")
            .str("START")
            .str("time_us")
            .int(i)
            .op(b"u");
    }
    p.op(b"eu");
    let (path, message) = structure_error(&p.stop());
    assert!(path.starts_with("external_annotations["), "{path}");
    assert!(
        message.starts_with("the annotations' names hold more than"),
        "{message}"
    );
}

/// A snapshot whose allocations alternate between a site with a `file` of `file_chars`
/// characters (its function `function_chars` long) and a short one, `pairs` times, never freed.
fn long_named_sites(pairs: u64, file_chars: usize, function_chars: usize) -> Snapshot {
    use vramscope_model::{CallSite, EventKind};
    let mut snapshot = vramscope_testkit::device_run(0, 1 << 20);
    snapshot.events.clear();
    snapshot.steps.clear();
    snapshot.segments.clear();
    let long = CallSite {
        file: "f".repeat(file_chars),
        line: 7,
        function: "g".repeat(function_chars),
        ..snapshot.sites[0].clone()
    };
    let short = CallSite {
        file: "short.py".to_string(),
        line: 8,
        ..snapshot.sites[0].clone()
    };
    snapshot.sites = vec![long, short];
    for i in 0..pairs * 2 {
        let e = vramscope_testkit::event(EventKind::Alloc)
            .seq(i)
            .time_ns(i * 1000)
            .addr((1 << 30) + 512 * i)
            .size(512)
            .site((i % 2) as u32)
            .build();
        snapshot.events.push(e);
    }
    snapshot
}

#[test]
fn labels_repeated_per_step_or_per_event_cut_a_long_name() {
    // Steps inferred at a site with a 400 KB file name: each step's label was a copy (2.4 GB
    // for 6,000 steps from 1 MB).
    let snapshot = long_named_sites(100, 400_000, 0);
    let view = vramscope_analysis::model_view::ModelView::new(&snapshot);
    assert!(view.steps().len() > 50, "steps are inferred");
    for step in view.steps() {
        assert!(step.label.chars().count() <= 260, "{}", step.label.len());
    }
    // Perfetto names each allocation's slice by its site: a 200 KB function name made 6 GB.
    let snapshot = long_named_sites(1_000, 100, 200_000);
    let json = vramscope_export::to_perfetto(&snapshot).unwrap();
    assert!(json.len() < 4_000_000, "{} bytes", json.len());
    assert!(json.contains("ggg…"), "the function is cut, and says so");
}

/// Issue 44, item 1: the 15-byte pickle. Protocol 5, then `BINBYTES8`, `BINUNICODE8` or
/// `BYTEARRAY8` (or a `FRAME`) with an eight-byte length near 2^64 or 2^63, and a few bytes:
/// every length once wrapped the count of bytes a streaming read waits for, and the import
/// spun forever. Each is an error naming the opcode and its offset, plain and gzipped, from a
/// file and from bytes; a test that hangs is the failure.
#[test]
fn eight_byte_lengths_near_2_pow_64_and_2_pow_63_are_errors_at_once() {
    let dir = std::env::temp_dir().join(format!("vramscope-lengths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (op, name) in [
        (0x8e, "BINBYTES8"),
        (0x8d, "BINUNICODE8"),
        (0x96, "BYTEARRAY8"),
        (0x95, "FRAME"),
    ] {
        let lengths = (1..=12u64).map(|k| u64::MAX - k + 1).chain([
            1 << 63,
            (1 << 63) - 1,
            (1 << 63) + 9,
            (1 << 62) + 1,
        ]);
        for n in lengths {
            let mut bytes = vec![0x80, 5, op];
            bytes.extend_from_slice(&n.to_le_bytes());
            bytes.extend_from_slice(b"N.N.");
            assert_eq!(bytes.len(), 15);
            for (what, data) in [("plain", bytes.clone()), ("gzip", gzip(&bytes))] {
                let e = load(&data, "h.pickle").unwrap_err();
                let text = e.to_string();
                assert!(
                    text.contains(name) && text.contains("offset 2"),
                    "{name} {n} {what}: {text}"
                );
                let path = dir.join(format!("{name}-{n}-{what}.pickle"));
                std::fs::write(&path, &data).unwrap();
                let e = import::load(&path).unwrap_err();
                assert!(
                    e.to_string().contains(name),
                    "{name} {n} {what} (file): {e}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
