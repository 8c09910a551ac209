//! The pickle reader's fast path for trace entries against its generic machine: every
//! PyTorch snapshot imports into the same snapshot, or fails with the same error, whichever
//! reads its entries (`from_pickle_bytes` against `from_pickle_bytes_generic`), and the same
//! as the whole document converted at once (`from_document`).
//!
//! The inputs are the shared traces in `../shared/traces` (or `$VRAMSCOPE_TRACES`; without them
//! that part says so in one line and checks nothing), and snapshots written here as Python's
//! pickler writes them (protocol 4: strings, frame dicts and lists shared through the memo),
//! with entries the fast path must read as the generic machine does and entries it must leave
//! to it: keys in another order, keys missing, extra keys, keys not memoized or memoized at
//! another index, values of odd types, frames lists shared, empty, of one element or memoized
//! after they are filled, new frame dicts inside an entry, `FRAME` opcodes between an entry's
//! opcodes, and the bytes of all of these cut or changed at random.

use std::path::{Path, PathBuf};

use vramscope_import::pytorch::{from_document, from_pickle_bytes, from_pickle_bytes_generic};
use vramscope_import::ImportOptions;
use vramscope_pickle::Document;

/// The three imports of `bytes`, as results whose errors are their messages.
fn imports(bytes: &[u8]) -> [Result<vramscope_model::Snapshot, String>; 3] {
    let options = ImportOptions::default();
    let fast = from_pickle_bytes(bytes, "t", &options).map_err(|e| e.to_string());
    let generic = from_pickle_bytes_generic(bytes, "t", &options).map_err(|e| e.to_string());
    let whole = Document::parse_with_limits(bytes, &vramscope_import::pytorch::limits(&options))
        .map_err(|e| format!("t: {e}"))
        .and_then(|doc| from_document(&doc, "t", &options).map_err(|e| e.to_string()));
    [fast, generic, whole]
}

/// Checks that the fast path, the generic machine and the whole document agree on `bytes`;
/// returns the snapshot or the error.
fn agree(bytes: &[u8], what: &str) -> Result<vramscope_model::Snapshot, String> {
    let [fast, generic, whole] = imports(bytes);
    assert_eq!(
        fast, generic,
        "{what}: the fast path and the generic machine differ"
    );
    // The whole document's error may name the stage differently only if the streamed one
    // did; both come from the same conversion.
    assert_eq!(
        fast, whole,
        "{what}: the streamed import and the whole document differ"
    );
    fast
}

#[test]
fn the_shared_traces_import_the_same_through_either_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some(dir) = vramscope_testkit::shared_traces_folder(&root) else {
        return;
    };
    let entries = std::fs::read_dir(&dir).expect("the shared traces folder lists");
    let mut pickles: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    pickles.sort();
    for path in pickles {
        let bytes = std::fs::read(&path).expect("a shared trace");
        let snapshot = agree(&bytes, &path.display().to_string()).expect("a shared trace imports");
        assert!(!snapshot.events.is_empty(), "{}", path.display());
    }
}

// Opcodes, as CPython's pickletools names them.
const MARK: u8 = b'(';
const STOP: u8 = b'.';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const NONE: u8 = b'N';
const BINUNICODE: u8 = b'X';
const APPEND: u8 = b'a';
const EMPTY_DICT: u8 = b'}';
const APPENDS: u8 = b'e';
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';
const EMPTY_LIST: u8 = b']';
const BINPUT: u8 = b'q';
const LONG_BINPUT: u8 = b'r';
const SETITEMS: u8 = b'u';
const BINFLOAT: u8 = b'G';
const PROTO: u8 = 0x80;
const NEWTRUE: u8 = 0x88;
const LONG1: u8 = 0x8a;
const SHORT_BINUNICODE: u8 = 0x8c;
const MEMOIZE: u8 = 0x94;
const FRAME: u8 = 0x95;

/// A small deterministic generator (xorshift), so that every run checks the same files.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Writes pickle opcodes as Python's pickler (protocol 4) does, with the memo's bookkeeping.
struct Emit {
    out: Vec<u8>,
    memo: u32,
    strings: std::collections::HashMap<String, u32>,
}

impl Emit {
    fn new() -> Emit {
        Emit {
            out: vec![PROTO, 4],
            memo: 0,
            strings: Default::default(),
        }
    }

    fn op(&mut self, op: u8) {
        self.out.push(op);
    }

    fn memoize(&mut self) -> u32 {
        self.out.push(MEMOIZE);
        self.memo += 1;
        self.memo - 1
    }

    /// Stores at the next index with `BINPUT` or `LONG_BINPUT` rather than `MEMOIZE`.
    fn put(&mut self) -> u32 {
        let index = self.memo;
        if let Ok(small) = u8::try_from(index) {
            self.out.extend([BINPUT, small]);
        } else {
            self.out.push(LONG_BINPUT);
            self.out.extend(index.to_le_bytes());
        }
        self.memo += 1;
        index
    }

    fn get(&mut self, index: u32) {
        match u8::try_from(index) {
            Ok(small) => self.out.extend([BINGET, small]),
            Err(_) => {
                self.out.push(LONG_BINGET);
                self.out.extend(index.to_le_bytes());
            }
        }
    }

    fn new_str(&mut self, text: &str) {
        let bytes = text.as_bytes();
        if bytes.len() < 256 {
            self.out.extend([SHORT_BINUNICODE, bytes.len() as u8]);
        } else {
            self.out.push(BINUNICODE);
            self.out.extend((bytes.len() as u32).to_le_bytes());
        }
        self.out.extend(bytes);
    }

    /// A string shared through the memo after its first occurrence, as Python shares the
    /// interned keys and repeated texts of a snapshot.
    fn shared(&mut self, text: &str) {
        match self.strings.get(text) {
            Some(&index) => self.get(index),
            None => {
                self.new_str(text);
                let index = self.memoize();
                self.strings.insert(text.to_string(), index);
            }
        }
    }

    fn int(&mut self, v: i64) {
        if (0..256).contains(&v) {
            self.out.extend([BININT1, v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(BININT2);
            self.out.extend((v as u16).to_le_bytes());
        } else if let Ok(small) = i32::try_from(v) {
            self.out.push(BININT);
            self.out.extend(small.to_le_bytes());
        } else {
            // LONG1 with the fewest bytes, as Python encodes it.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let (last, below) = (bytes[n - 1], bytes[n - 2] & 0x80 != 0);
                if (last == 0 && !below) || (last == 0xff && below) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend([LONG1, n as u8]);
            self.out.extend(&bytes[..n]);
        }
    }

    fn uint(&mut self, v: u64) {
        match i64::try_from(v) {
            Ok(v) => self.int(v),
            Err(_) => {
                self.out.extend([LONG1, 9]);
                self.out.extend(v.to_le_bytes());
                self.out.push(0);
            }
        }
    }

    fn float(&mut self, v: f64) {
        self.out.push(BINFLOAT);
        self.out.extend(v.to_be_bytes());
    }
}

/// How the entries of a generated snapshot may stray from what Python writes.
#[derive(Clone, Copy)]
struct Strays {
    /// One entry in how many strays in each way (0: never).
    one_in: u64,
    /// Whether strays may make the import fail: values of odd types where the import reads
    /// them, required keys missing. When not, every snapshot imports.
    hostile: bool,
}

/// A snapshot of `n` entries on `devices` devices in Python's shape, with strays.
struct Gen {
    e: Emit,
    rng: Rng,
    strays: Strays,
    /// The memo index of each frame dict written so far.
    frame_dicts: Vec<Option<u32>>,
    /// Memo indices of frames lists written so far.
    lists: Vec<u32>,
    time: u64,
}

impl Gen {
    fn new(seed: u64, strays: Strays) -> Gen {
        Gen {
            e: Emit::new(),
            rng: Rng(seed | 1),
            strays,
            frame_dicts: vec![None; 40],
            lists: Vec::new(),
            time: 1_700_000_000_000_000,
        }
    }

    fn stray(&mut self) -> bool {
        self.strays.one_in > 0 && self.rng.one_in(self.strays.one_in)
    }

    fn frame(&mut self, i: usize) {
        if let Some(index) = self.frame_dicts[i] {
            self.e.get(index);
            return;
        }
        self.e.op(EMPTY_DICT);
        let index = self.e.memoize();
        self.e.op(MARK);
        self.e.shared("filename");
        self.e.shared(&format!("/home/u/model{}.py", i % 5));
        self.e.shared("name");
        self.e.shared(&format!("f{i}"));
        self.e.shared("line");
        self.e.int(10 + i as i64 * 7);
        self.e.op(SETITEMS);
        self.frame_dicts[i] = Some(index);
    }

    /// An entry's frames: a new list of frame dicts (most), or an earlier list, or strays.
    fn frames(&mut self) {
        if self.stray() && !self.lists.is_empty() {
            let back = self.rng.below(self.lists.len() as u64) as usize;
            let index = self.lists[self.lists.len() - 1 - back];
            self.e.get(index);
            return;
        }
        let depth = match self.rng.below(10) {
            0 if self.stray() => 0,
            1 if self.stray() => 1,
            _ => 2 + self.rng.below(18) as usize,
        };
        let base = self.rng.below(20) as usize;
        self.e.op(EMPTY_LIST);
        let after = self.stray();
        if !after {
            let index = self.e.memoize();
            self.lists.push(index);
        }
        match depth {
            0 => {}
            1 => {
                self.frame(base);
                self.e.op(APPEND);
            }
            _ => {
                self.e.op(MARK);
                for k in 0..depth {
                    self.frame((base + k) % 40);
                }
                self.e.op(APPENDS);
            }
        }
        if after {
            let index = self.e.memoize();
            self.lists.push(index);
        }
    }

    /// A value of an odd type, where a number or a list is expected.
    fn odd(&mut self) {
        match self.rng.below(8) {
            0 => self.e.op(NONE),
            1 => self.e.op(NEWTRUE),
            2 => self.e.float(12.5),
            3 => self.e.shared("x"),
            4 => self.e.int(-5 << (self.rng.below(50) as u32)),
            5 => self.e.uint(u64::MAX),
            6 => {
                self.e.op(EMPTY_DICT);
                self.e.memoize();
            }
            _ => self.e.new_str("new"),
        }
    }

    fn key(&mut self, key: &str) {
        if self.stray() {
            // Not shared, stored at an index of its own, or not stored at all.
            self.e.new_str(key);
            match self.rng.below(3) {
                0 => {
                    self.e.put();
                }
                1 => {
                    self.e.memoize();
                }
                _ => {}
            }
        } else {
            self.e.shared(key);
        }
    }

    fn entry(&mut self, i: u64) {
        const ACTIONS: [&str; 8] = [
            "alloc",
            "free_requested",
            "free_completed",
            "segment_alloc",
            "segment_free",
            "snapshot",
            "oom",
            "weird_new_action",
        ];
        self.e.op(EMPTY_DICT);
        match self.rng.below(3) {
            _ if !self.stray() => {
                self.e.memoize();
            }
            0 => {
                self.e.put();
            }
            1 => {}
            _ => {
                // Memoized at an index out of order.
                self.e.out.extend([BINPUT, 3]);
            }
        }
        self.e.op(MARK);
        let mut keys: Vec<&str> = vec![
            "action",
            "addr",
            "size",
            "stream",
            "time_us",
            "compile_context",
            "frames",
        ];
        if self.stray() {
            // Mostly keys an entry may lack; now and then one it needs.
            let at = if self.strays.hostile && self.stray() {
                self.rng.below(keys.len() as u64) as usize
            } else {
                3 + self.rng.below(4) as usize
            };
            keys.remove(at);
        }
        if self.stray() {
            let a = self.rng.below(keys.len() as u64) as usize;
            let b = self.rng.below(keys.len() as u64) as usize;
            keys.swap(a, b);
        }
        if self.stray() {
            keys.push(
                ["user_metadata", "device_free", "addr", "extra"][self.rng.below(4) as usize],
            );
        }
        let block = 1 << 32 | (i % 50) << 20;
        for key in keys {
            if self.stray() && self.stray() {
                // A FRAME of no bytes between two opcodes.
                self.e.op(FRAME);
                self.e.out.extend(0u64.to_le_bytes());
            }
            self.key(key);
            // Odd values mostly under keys the import does not read.
            let read = !matches!(key, "compile_context" | "user_metadata" | "extra");
            if self.stray() && (!read || self.strays.hostile && self.stray()) {
                self.odd();
                continue;
            }
            match key {
                "action" => {
                    let action = if self.strays.hostile && self.stray() {
                        ACTIONS[self.rng.below(8) as usize]
                    } else {
                        ACTIONS[(i % 3) as usize]
                    };
                    self.e.shared(action);
                }
                "addr" => self.e.uint(block),
                "size" => self.e.uint(512 << (i % 7)),
                "stream" => {
                    let stream = if self.stray() { -1 } else { 0 };
                    self.e.int(stream);
                }
                "time_us" => {
                    self.time += 1 + self.rng.below(5);
                    if self.stray() {
                        self.e.float(self.time as f64);
                    } else {
                        self.e.uint(self.time);
                    }
                }
                "compile_context" => {
                    self.e.new_str("N/A");
                    self.e.memoize();
                }
                "frames" => self.frames(),
                "device_free" => self.e.uint(1 << 30),
                "user_metadata" => {
                    self.e.new_str("");
                    self.e.memoize();
                }
                _ => self.e.int(7),
            }
        }
        self.e.op(SETITEMS);
    }

    /// The snapshot: one segment, then `device_traces` with `lists` lists of `n` entries
    /// each (Python's batches of 1,000 entries per `APPENDS`), then `allocator_settings`.
    fn snapshot(mut self, lists: u64, n: u64) -> Vec<u8> {
        self.e.op(EMPTY_DICT);
        self.e.memoize();
        self.e.op(MARK);
        self.e.shared("segments");
        self.e.op(EMPTY_LIST);
        self.e.memoize();
        self.e.op(EMPTY_DICT);
        self.e.memoize();
        self.e.op(MARK);
        for (key, value) in [
            ("device", 0u64),
            ("address", 1 << 32),
            ("total_size", 64 << 20),
        ] {
            self.e.shared(key);
            self.e.uint(value);
        }
        self.e.shared("stream");
        self.e.int(0);
        self.e.shared("segment_type");
        self.e.shared("large");
        self.e.shared("blocks");
        self.e.op(EMPTY_LIST);
        self.e.memoize();
        self.e.op(SETITEMS);
        self.e.op(APPEND);
        self.e.shared("device_traces");
        self.e.op(EMPTY_LIST);
        self.e.memoize();
        self.e.op(MARK);
        for _ in 0..lists {
            self.e.op(EMPTY_LIST);
            self.e.memoize();
            let mut i = 0;
            while i < n {
                let batch = (n - i).min(1000);
                if batch == 1 {
                    self.entry(i);
                    self.e.op(APPEND);
                } else {
                    self.e.op(MARK);
                    for k in 0..batch {
                        self.entry(i + k);
                    }
                    self.e.op(APPENDS);
                }
                i += batch;
            }
        }
        self.e.op(APPENDS);
        self.e.shared("allocator_settings");
        self.e.op(EMPTY_DICT);
        self.e.memoize();
        self.e.op(SETITEMS);
        self.e.op(STOP);
        self.e.out
    }
}

#[test]
fn snapshots_in_pythons_shape_import_the_same_through_either_path() {
    for (seed, lists, n) in [(1, 1, 3000), (2, 2, 1001), (3, 1, 1), (4, 3, 400)] {
        let bytes = Gen::new(
            seed,
            Strays {
                one_in: 0,
                hostile: false,
            },
        )
        .snapshot(lists, n);
        let snapshot =
            agree(&bytes, &format!("seed {seed}")).expect("a snapshot in Python's shape");
        assert_eq!(snapshot.events.len() as u64, lists * n, "seed {seed}");
    }
}

#[test]
fn entries_that_stray_from_pythons_shape_import_the_same_through_either_path() {
    for seed in 0..40u64 {
        let strays = Strays {
            one_in: [3, 7, 20, 60][seed as usize % 4],
            hostile: false,
        };
        let bytes = Gen::new(seed * 7919 + 11, strays).snapshot(1 + seed % 2, 150);
        let snapshot = agree(&bytes, &format!("seed {seed}"));
        assert!(snapshot.is_ok(), "seed {seed}: {snapshot:?}");
    }
}

#[test]
fn entries_of_odd_types_fail_the_same_through_either_path() {
    let mut failed = 0;
    for seed in 0..40u64 {
        let strays = Strays {
            one_in: [5, 20, 60, 200][seed as usize % 4],
            hostile: true,
        };
        let bytes = Gen::new(seed * 104_729 + 3, strays).snapshot(1 + seed % 2, 150);
        failed += usize::from(agree(&bytes, &format!("seed {seed}")).is_err());
    }
    assert!(failed >= 10, "only {failed} of 40 failed");
}

#[test]
fn cut_and_changed_bytes_give_the_same_result_through_either_path() {
    let clean = Gen::new(
        99,
        Strays {
            one_in: 40,
            hostile: true,
        },
    )
    .snapshot(2, 60);
    let mut rng = Rng(12345);
    for round in 0..300 {
        let mut bytes = clean.clone();
        match round % 3 {
            0 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
            _ => {
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(bytes.len() as u64) as usize;
                    bytes[at] = rng.next() as u8;
                }
            }
        }
        let _ = agree(&bytes, &format!("round {round}"));
    }
}

/// A snapshot as `attach()` leaves it under a newer torch, written by Python's pickler: each
/// allocation carries PyTorch's custom allocation metadata (`user_metadata`), and the
/// annotations are `attach()`'s phase and module marks only (an inference run: no optimizer
/// step). The metadata becomes each event's tag, the same through the fast path, the generic
/// machine and the whole document, so that `LiveMark::parse` and `Category::from_tag` read
/// it; and the marks are no steps.
#[test]
fn user_metadata_is_the_events_tag_and_marks_are_no_steps() {
    let code = r#"
import pickle, sys
fr = [{'filename': '/home/u/infer.py', 'line': 7, 'name': 'main'}]
def alloc(addr, t, meta):
    e = {'action': 'alloc', 'addr': addr, 'size': 1048576, 'stream': 0, 'time_us': t, 'frames': fr}
    if meta is not None:
        e['user_metadata'] = meta
    return e
def free(addr, t):
    return {'action': 'free_completed', 'addr': addr, 'size': 1048576, 'stream': 0, 'time_us': t, 'frames': fr}
entries = []
for i in range(3):
    base = 0x1000000 + i * 0x200000
    entries.append(alloc(base, 100 * i + 1, 'vramscope:phase=forward_no_grad;module=Net.fc'))
    entries.append(alloc(base + 0x100000, 100 * i + 2, 'weights'))
    entries.append(alloc(base + 0x180000, 100 * i + 3, ''))
    entries.append(alloc(base + 0x1c0000, 100 * i + 4, None))
    entries.append(free(base, 100 * i + 5))
marks = []
for i in range(3):
    for name in ['vramscope.phase#forward_no_grad', 'vramscope.module#Net', 'vramscope.module#Net.fc']:
        marks.append({'name': name, 'stage': 'START', 'device': 0, 'time_us': 100 * i})
        marks.append({'name': name, 'stage': 'END', 'device': 0, 'time_us': 100 * i + 6})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [entries], 'external_annotations': marks}, protocol=4))
"#;
    let out = match std::process::Command::new("python3")
        .arg("-c")
        .arg(code)
        .output()
    {
        Ok(out) if out.status.success() => out.stdout,
        _ => {
            println!("skipped: python3 not found, user_metadata pickle not written");
            return;
        }
    };
    let snapshot = agree(&out, "user_metadata").expect("imports");
    let tags: Vec<Option<&str>> = snapshot
        .events
        .iter()
        .filter(|e| e.kind == vramscope_model::EventKind::Alloc)
        .map(|e| snapshot.tag(e.tag()))
        .collect();
    let forward = "vramscope:phase=forward_no_grad;module=Net.fc";
    assert_eq!(
        tags,
        [Some(forward), Some("weights"), None, None].repeat(3),
        "an empty or absent metadata is no tag"
    );
    assert_eq!(snapshot.tags.len(), 2, "each distinct metadata once");
    let mark = vramscope_model::marks::LiveMark::parse(forward).expect("a mark");
    assert_eq!(
        mark.phase,
        Some(vramscope_model::marks::MarkedPhase::ForwardNoGrad)
    );
    assert_eq!(
        vramscope_model::Category::from_tag("weights"),
        Some(vramscope_model::Category::Parameters)
    );
    // attach()'s marks say where the program is, never where a step begins: the fallback
    // step family (the first START annotation) skips them.
    assert!(
        snapshot.steps.is_empty(),
        "marks taken as steps: {:?}",
        snapshot.steps
    );
    assert_eq!(
        snapshot.annotations.len(),
        18,
        "the marks are kept as annotations"
    );
}
