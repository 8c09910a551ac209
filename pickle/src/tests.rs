//! Tests of the pickle reader: every opcode family, the memo, the limits and their errors,
//! documents against value trees, and property tests that no input makes it panic.
//!
//! They exercise `super::parse` and `super::Document` end to end; the decoding of long
//! integers is checked against `super::args::int_from_le` with a reference of its own.

use std::rc::Rc;

use super::args::{int_from_le, PyInt, MAX_DECIMAL_DIGITS};
use super::*;

fn p(bytes: &[u8]) -> Value {
    match parse(bytes) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

fn err(bytes: &[u8]) -> PickleError {
    match parse(bytes) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

fn s(text: &str) -> Value {
    Value::Str(Rc::from(text))
}

fn list(items: Vec<Value>) -> Value {
    Value::List(items.into())
}

fn tuple(items: Vec<Value>) -> Value {
    Value::Tuple(items.into())
}

#[test]
fn scalars() {
    assert_eq!(p(b"\x80\x02N."), Value::None);
    assert_eq!(p(b"\x80\x02\x88."), Value::Bool(true));
    assert_eq!(p(b"\x80\x02\x89."), Value::Bool(false));
    assert_eq!(p(b"K\xff."), Value::Int(255));
    assert_eq!(p(b"M\x01\x02."), Value::Int(0x0201));
    assert_eq!(p(b"J\xff\xff\xff\xff."), Value::Int(-1));
    assert_eq!(p(b"G?\xf8\x00\x00\x00\x00\x00\x00."), Value::Float(1.5));
    assert_eq!(p(b"I42\n."), Value::Int(42));
    assert_eq!(p(b"I-7\n."), Value::Int(-7));
    assert_eq!(p(b"I01\n."), Value::Bool(true));
    assert_eq!(p(b"I00\n."), Value::Bool(false));
    assert_eq!(p(b"L123L\n."), Value::Int(123));
    assert_eq!(p(b"F2.25\n."), Value::Float(2.25));
}

#[test]
fn long_integers() {
    assert_eq!(p(b"\x8a\x00."), Value::Int(0));
    assert_eq!(p(b"\x8a\x01\xff."), Value::Int(-1));
    assert_eq!(p(b"\x8a\x02\xff\x00."), Value::Int(255));
    assert_eq!(p(b"\x8a\x05\x00\x00\x00\x00\x01."), Value::Int(1 << 32));
    assert_eq!(
        p(b"\x8b\x08\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f."),
        Value::Int(i64::MAX)
    );
    // 2**64 - 1 needs nine bytes and is kept as a big integer that still fits a u64.
    let big = p(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.");
    assert!(matches!(big, Value::BigInt(_)));
    assert_eq!(big.as_u64(), Some(u64::MAX));
    assert_eq!(big.as_i64(), None);
    // 2**80 is too large for a u64.
    let huge = p(b"\x8a\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.");
    assert_eq!(huge.as_u64(), None);
    assert_eq!(huge.type_name(), "int");
    // Redundant sign bytes are dropped.
    assert_eq!(
        p(b"\x8a\x0a\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00."),
        Value::Int(5)
    );
    assert_eq!(
        p(b"L18446744073709551616L\n."),
        Value::BigInt(Rc::from(&[0u8, 0, 0, 0, 0, 0, 0, 0, 1][..]))
    );
    assert_eq!(
        p(b"L-9223372036854775809L\n."),
        Value::BigInt(Rc::from(
            &[0xffu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff][..]
        ))
    );
}

#[test]
fn strings_and_bytes() {
    assert_eq!(p(b"\x8c\x02hi."), s("hi"));
    assert_eq!(p(b"X\x03\x00\x00\x00abc."), s("abc"));
    assert_eq!(p(b"\x8d\x01\x00\x00\x00\x00\x00\x00\x00z."), s("z"));
    assert_eq!(p(b"Vcaf\\u00e9\n."), s("caf\u{e9}"));
    assert_eq!(p(b"U\x02ok."), s("ok"));
    assert_eq!(p(b"T\x01\x00\x00\x00k."), s("k"));
    assert_eq!(p(b"S'a\\nb'\n."), s("a\nb"));
    assert_eq!(p(b"U\x01\xff."), Value::Bytes(Rc::from(&b"\xff"[..])));
    assert_eq!(
        p(b"C\x02\x00\x01."),
        Value::Bytes(Rc::from(&b"\x00\x01"[..]))
    );
    assert_eq!(p(b"B\x01\x00\x00\x00q."), Value::Bytes(Rc::from(&b"q"[..])));
    assert_eq!(
        p(b"\x8e\x01\x00\x00\x00\x00\x00\x00\x00q."),
        Value::Bytes(Rc::from(&b"q"[..]))
    );
    assert_eq!(
        p(b"\x96\x01\x00\x00\x00\x00\x00\x00\x00r."),
        Value::Bytes(Rc::from(&b"r"[..]))
    );
    // Invalid UTF-8 in a text opcode is replaced, not an error.
    assert_eq!(p(b"\x8c\x01\xff."), s("\u{fffd}"));
}

#[test]
fn containers() {
    assert_eq!(p(b"]."), list(vec![]));
    assert_eq!(p(b")."), tuple(vec![]));
    assert_eq!(p(b"}."), Value::Dict(Vec::new().into()));
    assert_eq!(
        p(b"(K\x01K\x02l."),
        list(vec![Value::Int(1), Value::Int(2)])
    );
    assert_eq!(p(b"(K\x01t."), tuple(vec![Value::Int(1)]));
    assert_eq!(p(b"K\x01\x85."), tuple(vec![Value::Int(1)]));
    assert_eq!(
        p(b"K\x01K\x02\x86."),
        tuple(vec![Value::Int(1), Value::Int(2)])
    );
    assert_eq!(
        p(b"K\x01K\x02K\x03\x87."),
        tuple(vec![Value::Int(1), Value::Int(2), Value::Int(3)])
    );
    assert_eq!(p(b"]K\x07a."), list(vec![Value::Int(7)]));
    assert_eq!(
        p(b"](K\x01K\x02e."),
        list(vec![Value::Int(1), Value::Int(2)])
    );
    let d = p(b"}\x8c\x01aK\x01s.");
    assert_eq!(d.get("a"), Some(&Value::Int(1)));
    let d = p(b"}(\x8c\x01aK\x01\x8c\x01bK\x02u.");
    assert_eq!(d.get("b"), Some(&Value::Int(2)));
    let d = p(b"(\x8c\x01aK\x01d.");
    assert_eq!(d.get("a"), Some(&Value::Int(1)));
    assert_eq!(
        p(b"\x8f(K\x01K\x02K\x01\x90."),
        Value::Set(vec![Value::Int(1), Value::Int(2)].into())
    );
    assert_eq!(
        p(b"(K\x03K\x03\x91."),
        Value::FrozenSet(vec![Value::Int(3)].into())
    );
}

#[test]
fn dict_keeps_last_value_of_repeated_key() {
    let d = p(b"}(\x8c\x01aK\x01\x8c\x01bK\x02\x8c\x01aK\x03u.");
    let pairs = d.as_dict().unwrap();
    assert_eq!(pairs.len(), 2);
    assert_eq!(pairs[0], (s("a"), Value::Int(3)));
    assert_eq!(pairs[1], (s("b"), Value::Int(2)));
    // The same with more than sixteen keys takes the hashed path.
    let mut bytes = b"}(".to_vec();
    for i in 0..20u8 {
        bytes.extend_from_slice(&[b'K', i, b'K', i]);
    }
    bytes.extend_from_slice(b"K\x05K\x63u.");
    let d = p(&bytes);
    let pairs = d.as_dict().unwrap();
    assert_eq!(pairs.len(), 20);
    assert_eq!(pairs[5], (Value::Int(5), Value::Int(99)));
}

#[test]
fn stack_opcodes() {
    assert_eq!(p(b"K\x01K\x020."), Value::Int(1));
    assert_eq!(p(b"K\x01(K\x02K\x031."), Value::Int(1));
    assert_eq!(p(b"K\x012\x86."), tuple(vec![Value::Int(1), Value::Int(1)]));
    // POP with nothing above the mark pops the mark.
    assert_eq!(p(b"K\x01(0."), Value::Int(1));
}

#[test]
fn memo_shares_objects() {
    // [x, x] where x = ["s"], memoized with each kind of PUT and fetched with each GET.
    for (put, get) in [
        (&b"q\x00"[..], &b"h\x00"[..]),
        (&b"r\x00\x00\x00\x00"[..], &b"j\x00\x00\x00\x00"[..]),
        (&b"p0\n"[..], &b"g0\n"[..]),
        (&b"\x94"[..], &b"h\x00"[..]),
    ] {
        let mut bytes = b"\x80\x04](](\x8c\x01se".to_vec();
        bytes.extend_from_slice(put);
        bytes.extend_from_slice(get);
        bytes.extend_from_slice(b"e.");
        let v = p(&bytes);
        let items = v.as_seq().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0], list(vec![s("s")]));
        assert_eq!(items[0].identity(), items[1].identity());
        assert!(items[0].identity().is_some());
    }
}

#[test]
fn memoized_list_is_mutated_after_put() {
    // x = []; memo x; then append to it: later GETs see the appended element.
    let v = p(b"\x80\x04]\x94(K\x01eh\x00\x86.");
    assert_eq!(
        v,
        tuple(vec![list(vec![Value::Int(1)]), list(vec![Value::Int(1)])])
    );
}

#[test]
fn sparse_memo_indices() {
    let v = p(b"K\x01r\xff\xff\xff\xff0j\xff\xff\xff\xff.");
    assert_eq!(v, Value::Int(1));
    let e = err(b"K\x01j\x05\x00\x00\x00.");
    assert_eq!(e.kind, PickleErrorKind::MissingMemo { index: 5 });
    assert_eq!(e.offset, 2);
}

#[test]
fn frame_and_proto() {
    assert_eq!(
        p(b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N."),
        Value::None
    );
    let e = err(b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.");
    assert!(matches!(
        e.kind,
        PickleErrorKind::Truncated {
            opcode: "FRAME",
            ..
        }
    ));
    assert_eq!(e.offset, 2);
    let e = err(b"\x80\x06N.");
    assert_eq!(e.kind, PickleErrorKind::UnsupportedProtocol { version: 6 });
}

#[test]
fn refuses_code_execution_opcodes() {
    let e = err(b"\x80\x02cos\nsystem\n.");
    assert_eq!(e.offset, 2);
    assert!(matches!(
        e.kind,
        PickleErrorKind::Refused {
            opcode: "GLOBAL",
            ..
        }
    ));
    assert!(e.to_string().contains("GLOBAL"), "{e}");
    assert!(e.to_string().contains("offset 2"), "{e}");
    for (byte, name) in [
        (b'c', "GLOBAL"),
        (0x93, "STACK_GLOBAL"),
        (b'R', "REDUCE"),
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
        (0x97, "NEXT_BUFFER"),
        (0x98, "READONLY_BUFFER"),
    ] {
        let e = err(&[0x80, 4, b'N', byte, b'.']);
        assert_eq!(e.offset, 3, "{name}");
        match e.kind {
            PickleErrorKind::Refused { opcode, .. } => assert_eq!(opcode, name),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn structural_errors() {
    assert_eq!(err(b"").kind, PickleErrorKind::Empty);
    assert_eq!(err(b"N").kind, PickleErrorKind::MissingStop);
    assert_eq!(err(b"N").offset, 1);
    assert!(matches!(
        err(b".").kind,
        PickleErrorKind::StackUnderflow { opcode: "STOP" }
    ));
    assert!(matches!(
        err(b"Ne.").kind,
        PickleErrorKind::MissingMark { opcode: "APPENDS" }
    ));
    assert!(matches!(
        err(b"}K\x01a.").kind,
        PickleErrorKind::WrongType {
            opcode: "APPEND",
            expected: "list",
            found: "dict"
        }
    ));
    assert!(matches!(
        err(b"(K\x01d.").kind,
        PickleErrorKind::BadArgument { opcode: "DICT", .. }
    ));
    assert!(matches!(
        err(b"\xff.").kind,
        PickleErrorKind::UnknownOpcode { byte: 0xff }
    ));
    assert!(matches!(
        err(b"T\xff\xff\xff\xff.").kind,
        PickleErrorKind::BadArgument {
            opcode: "BINSTRING",
            ..
        }
    ));
    assert!(matches!(
        err(b"X\xff\xff\xff\x7f.").kind,
        PickleErrorKind::Truncated {
            opcode: "BINUNICODE",
            needed: 0x7fff_ffff,
            available: 1
        }
    ));
    assert!(matches!(
        err(b"(\x86.").kind,
        PickleErrorKind::StackUnderflow { opcode: "TUPLE2" }
    ));
    assert!(matches!(
        err(b"]\x94(h\x00a.").kind,
        PickleErrorKind::StackUnderflow { .. }
    ));
}

#[test]
fn cycles_are_errors() {
    // l = []; l.append(l)
    let e = err(b"\x80\x04]\x94h\x00a.");
    assert_eq!(e.kind, PickleErrorKind::Cycle);
    assert_eq!(e.offset, 2);
}

#[test]
fn limits_are_enforced() {
    // 300 nested lists: ]]]...]aaa...a.
    let mut deep = vec![b']'; 300];
    deep.extend_from_slice(&[b'a'; 299]);
    deep.push(b'.');
    let e = err(&deep);
    assert!(matches!(
        e.kind,
        PickleErrorKind::LimitExceeded {
            what: "levels of nesting",
            ..
        }
    ));
    // A memory budget of 60 bytes for any input: the fifth element of the list passes it
    // (a list is 16 bytes, its entry in the table of equal lists 24, each element 4, and
    // the list's place on the stack 4 more).
    let limits = Limits {
        memory_per_input_byte: 0,
        min_memory_bytes: 60,
        ..Limits::default()
    };
    assert!(parse_with_limits(b"](NNNNe.", &limits).is_ok());
    let e = parse_with_limits(b"](NNNNNe.", &limits).unwrap_err();
    assert_eq!(
        e.kind,
        PickleErrorKind::MemoryBudget {
            limit: 60,
            input_bytes: 9,
            per_input_byte: 0
        }
    );
    assert_eq!(e.offset, 8, "at STOP");
    let limits = Limits {
        max_input_bytes: 1,
        ..Limits::default()
    };
    let e = parse_with_limits(b"N.", &limits).unwrap_err();
    assert_eq!(e.kind, PickleErrorKind::InputTooLarge { size: 2, limit: 1 });
    let text = e.to_string();
    assert!(
        text.contains("--max-input") && text.contains("VRAMSCOPE_MAX_INPUT"),
        "{text}"
    );
}

/// A small pickle in the shape of a PyTorch snapshot, written by Python 3 with protocol 4.
const SNAPSHOT_LIKE: &[u8] = b"\x80\x04\x95p\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94(\x8c\x07address\x94\x8a\x05\x00\x00\x00\x00\x01\x8c\x06frames\x94]\x94}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03uaua\x8c\x05trace\x94]\x94(h\x06h\x06e\x8c\x04pool\x94K\x00K\x01\x86\x94u.";

#[test]
fn snapshot_like_pickle() {
    let v = p(SNAPSHOT_LIKE);
    let seg = &v.get("segments").unwrap().as_seq().unwrap()[0];
    assert_eq!(seg.get("address").unwrap().as_u64(), Some(1 << 32));
    let frames = seg.get("frames").unwrap();
    let trace = v.get("trace").unwrap().as_seq().unwrap();
    assert_eq!(trace.len(), 2);
    assert_eq!(trace[0].identity(), frames.identity());
    assert_eq!(
        frames.as_seq().unwrap()[0]
            .get("filename")
            .unwrap()
            .as_str(),
        Some("a.py")
    );
    assert_eq!(
        v.get("pool"),
        Some(&tuple(vec![Value::Int(0), Value::Int(1)]))
    );
}

#[test]
fn every_truncation_is_an_error() {
    for end in 0..SNAPSHOT_LIKE.len() {
        let e = parse(&SNAPSHOT_LIKE[..end]).unwrap_err();
        assert!(e.offset <= end, "prefix {end}: {e}");
    }
}

fn doc(bytes: &[u8]) -> Document {
    match Document::parse(bytes) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn value_refs_read_like_values() {
    // (None, True, 7, -2**27, 2**27, -2**40, 2**64 - 1, 2**80, 1.5, "é", b"\x00", [1, (2,)],
    //  {"k": None})
    let mut bytes = b"\x80\x04(N\x88K\x07J\x00\x00\x00\xf8J\x00\x00\x00\x08".to_vec();
    bytes.extend_from_slice(b"\x8a\x06\x00\x00\x00\x00\x00\xff");
    bytes.extend_from_slice(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00");
    bytes.extend_from_slice(b"\x8a\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01");
    bytes.extend_from_slice(b"G?\xf8\x00\x00\x00\x00\x00\x00\x8c\x02\xc3\xa9C\x01\x00");
    bytes.extend_from_slice(b"(K\x01K\x02\x85l}\x8c\x01kNst.");
    let d = doc(&bytes);
    let root = d.root();
    assert_eq!(root.type_name(), "tuple");
    let items = root.as_seq().unwrap();
    assert_eq!(items.len(), 13);
    let at = |i: usize| items.get(i).unwrap();
    assert!(at(0).is_none());
    assert_eq!(at(1).as_bool(), Some(true));
    assert_eq!(at(2).as_i64(), Some(7));
    assert_eq!(at(3).as_i64(), Some(-(1 << 27)));
    assert_eq!(at(4).as_u64(), Some(1 << 27));
    assert_eq!(at(5).as_i64(), Some(-(1 << 40)));
    assert_eq!(at(5).as_u64(), None);
    assert_eq!(at(6).as_u64(), Some(u64::MAX));
    assert_eq!(at(6).as_i64(), None);
    assert_eq!((at(7).type_name(), at(7).as_u64()), ("int", None));
    assert_eq!(at(8).as_float(), Some(1.5));
    assert_eq!(at(2).as_float(), None);
    assert_eq!(at(2).as_f64(), Some(7.0));
    assert_eq!(at(9).as_str(), Some("\u{e9}"));
    assert_eq!(at(10).as_bytes(), Some(&b"\x00"[..]));
    let list = at(11).as_seq().unwrap();
    assert_eq!(list.last().unwrap().type_name(), "tuple");
    assert_eq!(
        list.iter().map(|v| v.type_name()).collect::<Vec<_>>(),
        ["int", "tuple"]
    );
    assert!(at(12).is_dict());
    assert!(at(12).get("k").unwrap().is_none());
    assert!(at(12).get("x").is_none());
    assert!(items.get(13).is_none());
    // The document and the value tree agree.
    assert_eq!(root.to_value(), p(&bytes));
}

#[test]
fn repeated_dict_keys_keep_the_last_value() {
    let d = doc(b"}(\x8c\x01aK\x01\x8c\x01bK\x02\x8c\x01aK\x03u.");
    let root = d.root();
    assert_eq!(root.get("a").unwrap().as_i64(), Some(3));
    let keys: Vec<&str> = root
        .dict_items()
        .unwrap()
        .map(|(k, _)| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a", "b", "a"]);
}

#[test]
fn equal_lists_share_their_elements() {
    // ([1, 2], [1, 2], [1, 3]), three separate lists.
    let d = doc(b"\x80\x04](K\x01K\x02e](K\x01K\x02e](K\x01K\x03e\x87.");
    let items = d.root().as_seq().unwrap();
    let id = |i: usize| items.get(i).unwrap().identity();
    assert!(id(0).is_some());
    assert_eq!(id(0), id(1));
    assert_ne!(id(0), id(2));
    let v = p(b"\x80\x04](K\x01K\x02e](K\x01K\x02e](K\x01K\x03e\x87.");
    let items = v.as_seq().unwrap();
    assert_eq!(items[0].identity(), items[1].identity());
    assert_ne!(items[0].identity(), items[2].identity());
}

#[test]
fn shared_list_that_grows_moves_to_its_own_elements() {
    // a = [1, 2]; b = [1, 2]; a.append(3); (a, b)
    let bytes = b"\x80\x04]\x94(K\x01K\x02e]\x94(K\x01K\x02e0K\x03ah\x01\x86.";
    let d = doc(bytes);
    let items = d.root().as_seq().unwrap();
    let (a, b) = (items.get(0).unwrap(), items.get(1).unwrap());
    assert_ne!(a.identity(), b.identity());
    let ints = |v: ValueRef<'_>| -> Vec<i64> {
        v.as_seq()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect()
    };
    assert_eq!(ints(a), [1, 2, 3]);
    assert_eq!(ints(b), [1, 2]);
    assert_eq!(
        p(bytes),
        tuple(vec![
            list(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
            list(vec![Value::Int(1), Value::Int(2)]),
        ])
    );
}

#[test]
fn containers_filled_in_interleaved_batches() {
    // outer = []; three batches of APPENDS, each of 700 dicts {"k": i, "l": [i, i + 2**40]}
    // built in between, as Python's pickler writes lists of more than 1000 elements.
    let mut bytes = b"\x80\x04]\x94\x8c\x01k\x940\x8c\x01l\x940".to_vec();
    let mut expected = Vec::new();
    for batch in 0..3 {
        bytes.push(b'(');
        for j in 0..700u32 {
            let i = batch * 700 + j;
            bytes.extend_from_slice(b"}(h\x01J");
            bytes.extend_from_slice(&i.to_le_bytes());
            bytes.extend_from_slice(b"h\x02](J");
            bytes.extend_from_slice(&i.to_le_bytes());
            bytes.extend_from_slice(b"\x8a\x06");
            bytes.extend_from_slice(&(i as u64 + (1 << 40)).to_le_bytes()[..6]);
            bytes.extend_from_slice(b"eu");
            expected.push((i as i64, i as i64 + (1 << 40)));
        }
        bytes.push(b'e');
    }
    bytes.push(b'.');
    let d = doc(&bytes);
    let outer = d.root().as_seq().unwrap();
    assert_eq!(outer.len(), 2100);
    for (entry, &(k, big)) in outer.iter().zip(&expected) {
        assert_eq!(entry.get("k").unwrap().as_i64(), Some(k));
        let l = entry.get("l").unwrap().as_seq().unwrap();
        assert_eq!(l.get(0).unwrap().as_i64(), Some(k));
        assert_eq!(l.get(1).unwrap().as_i64(), Some(big));
    }
    assert_eq!(d.root().to_value(), p(&bytes));
}

#[test]
fn nesting_limit_names_the_container_too_deep() {
    // 300 nested lists: the 201st (depth 201) is created by the opcode at offset 200.
    let mut deep = vec![b']'; 300];
    deep.extend_from_slice(&[b'a'; 299]);
    deep.push(b'.');
    let e = Document::parse(&deep).unwrap_err();
    assert_eq!(e.offset, 200);
    assert!(
        e.to_string().contains("more than 200 levels of nesting"),
        "{e}"
    );
}

#[test]
fn open_marks_are_bounded_by_the_nesting_limit() {
    // 200 open MARKs are as deep as data may nest; the 201st is refused where it stands.
    let mut bytes = vec![b'('; 200];
    bytes.extend_from_slice(b"N");
    bytes.extend_from_slice(&[b't'; 200]);
    bytes.push(b'.');
    assert!(parse(&bytes).is_ok());
    let mut bytes = vec![b'('; 10_000];
    bytes.push(b'.');
    let e = err(&bytes);
    assert_eq!(e.offset, 200);
    assert_eq!(
        e.kind,
        PickleErrorKind::LimitExceeded {
            what: "MARKs open at once (levels of nesting)",
            limit: 200
        }
    );
}

/// `value` in the minimal little-endian two's-complement bytes `LONG1` uses, computed
/// digit by digit in base 256 as a reference.
/// A reader that hands out `chunk` bytes at a time and counts what it gave.
struct Counted<'a> {
    data: &'a [u8],
    chunk: usize,
    given: usize,
}

impl std::io::Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.data.len() - self.given);
        buf[..n].copy_from_slice(&self.data[self.given..self.given + n]);
        self.given += n;
        Ok(n)
    }
}

/// [`Document::parse_read`] of `bytes` handed out 7 bytes at a time, and how many bytes
/// were read for it.
fn read_unsized(bytes: &[u8], limits: &Limits) -> (Result<Document, PickleError>, usize) {
    let given = std::cell::Cell::new(0);
    let mut open = || -> Box<dyn std::io::Read + '_> {
        Box::new(CountOnDrop {
            inner: Counted {
                data: bytes,
                chunk: 7,
                given: 0,
            },
            total: &given,
        })
    };
    let doc = Document::parse_read(&mut open, limits);
    (doc, given.get())
}

/// A [`Counted`] that adds what it gave to `total` when dropped.
struct CountOnDrop<'a, 'c> {
    inner: Counted<'a>,
    total: &'c std::cell::Cell<usize>,
}

impl std::io::Read for CountOnDrop<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Drop for CountOnDrop<'_, '_> {
    fn drop(&mut self) {
        self.total.set(self.total.get() + self.inner.given);
    }
}

#[test]
fn an_input_of_unknown_length_reads_as_the_whole_input_does() {
    let limits = Limits::default();
    let mut deep = vec![b']'; 300];
    deep.extend_from_slice(&[b'a'; 299]);
    deep.push(b'.');
    let mut cases: Vec<Vec<u8>> = vec![
        SNAPSHOT_LIKE.to_vec(),
        deep,
        b"\x80\x04]\x94h\x00a.".to_vec(),
        b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.".to_vec(),
        b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N.trailing".to_vec(),
        Vec::new(),
    ];
    cases.extend((0..SNAPSHOT_LIKE.len()).map(|end| SNAPSHOT_LIKE[..end].to_vec()));
    for bytes in &cases {
        let whole = Document::parse_with_limits(bytes, &limits);
        let (read, given) = read_unsized(bytes, &limits);
        match (whole, read) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.root().to_value(), b.root().to_value(), "{bytes:?}");
                assert_eq!(a.input_bytes(), b.input_bytes());
                assert_eq!(given, bytes.len(), "read to the end for the input's length");
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{bytes:?}"),
            (a, b) => panic!("{bytes:?}: whole {:?}, unsized {:?}", a.is_ok(), b.is_ok()),
        }
    }
    // The budget is that of the bytes read so far: the same error as the whole input's.
    let small = Limits {
        memory_per_input_byte: 0,
        min_memory_bytes: 60,
        ..Limits::default()
    };
    let e = read_unsized(b"](NNNNNe.", &small).0.unwrap_err();
    assert_eq!(
        e.kind,
        PickleErrorKind::MemoryBudget {
            limit: 60,
            input_bytes: 9,
            per_input_byte: 0
        }
    );
}

#[test]
fn an_input_of_unknown_length_is_read_no_further_than_its_first_error() {
    // 64 MiB of MARKs: refused at the 201st, after one piece of the input, not all of it.
    let mut bytes = vec![b'('; 64 << 20];
    bytes.push(b'.');
    let (read, given) = read_unsized(&bytes, &Limits::default());
    let e = read.unwrap_err();
    assert_eq!(e.offset, 200);
    assert!(matches!(
        e.kind,
        PickleErrorKind::LimitExceeded { limit: 200, .. }
    ));
    assert!(given <= 2 << 20, "{given} bytes read");
    // A document that fails its final check is read again to name where it went wrong.
    let (read, given) = read_unsized(b"\x80\x04]\x94h\x00a.", &Limits::default());
    assert_eq!(read.unwrap_err().kind, PickleErrorKind::Cycle);
    assert_eq!(given, 2 * 8, "read twice");
}

fn reference_le(digits: &str, negative: bool) -> Vec<u8> {
    let mut magnitude = vec![0u8];
    for d in digits.bytes() {
        let mut carry = (d - b'0') as u32;
        for byte in magnitude.iter_mut() {
            let v = *byte as u32 * 10 + carry;
            *byte = v as u8;
            carry = v >> 8;
        }
        if carry > 0 {
            magnitude.push(carry as u8);
        }
    }
    magnitude.push(0);
    if negative {
        let mut carry = 1u16;
        for byte in magnitude.iter_mut() {
            let v = (!*byte) as u16 + carry;
            *byte = v as u8;
            carry = v >> 8;
        }
    }
    match int_from_le(&magnitude) {
        PyInt::Big(bytes) => bytes,
        PyInt::Fits(v) => panic!("{v} fits"),
    }
}

#[test]
fn long_decimal_integers_parse_exactly_up_to_pythons_limit() {
    let mut digits = String::from("9");
    let mut state = 12345u64;
    while digits.len() < MAX_DECIMAL_DIGITS {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        digits.push(char::from(b'0' + (state >> 60) as u8 % 10));
        if [20, 38, 39, 40, 57, 100, 1000, MAX_DECIMAL_DIGITS].contains(&digits.len()) {
            for negative in [false, true] {
                let sign = if negative { "-" } else { "" };
                let v = p(format!("L{sign}{digits}L\n.").as_bytes());
                let expected = reference_le(&digits, negative);
                assert_eq!(v, Value::BigInt(Rc::from(expected)), "{sign}{digits}");
            }
        }
    }
    // One digit more is refused by name, as Python refuses it, without echoing them all.
    let e = err(format!("I{digits}1\n.").as_bytes());
    assert_eq!(e.offset, 0);
    let text = e.to_string();
    assert!(text.contains("4301 decimal digits"), "{text}");
    assert!(text.contains("more than 4300"), "{text}");
    assert!(text.len() < 200, "{text}");
    // Leading zeros count as digits, as in Python.
    let zeros = format!("I{}\n.", "0".repeat(5000));
    assert!(err(zeros.as_bytes())
        .to_string()
        .contains("5000 decimal digits"));
    // A bad argument is quoted in part.
    let e = err(format!("I{}x\n.", "1".repeat(100)).as_bytes());
    assert!(e.to_string().contains("(101 bytes)"), "{e}");
}

#[test]
fn repeated_keys_are_found_by_value_whatever_their_type() {
    // {0.0: 1, -0.0: 2, nan: 3, nan: 4, (1, 'a'): 5, (1, 'a'): 6, 1: 7, 1.0: 8}, the two
    // NaNs separate objects: 0.0 and -0.0 are one key, the NaNs two, the tuples one, and
    // 1 and 1.0 two (keys compare structurally).
    let nan = b"G\x7f\xf8\x00\x00\x00\x00\x00\x00";
    let mut bytes =
        b"}(G\x00\x00\x00\x00\x00\x00\x00\x00K\x01G\x80\x00\x00\x00\x00\x00\x00\x00K\x02".to_vec();
    bytes.extend_from_slice(nan);
    bytes.extend_from_slice(b"K\x03");
    bytes.extend_from_slice(nan);
    bytes.extend_from_slice(b"K\x04K\x01\x8c\x01a\x86K\x05K\x01\x8c\x01a\x86K\x06");
    bytes.extend_from_slice(b"K\x01K\x07G?\xf0\x00\x00\x00\x00\x00\x00K\x08u.");
    let d = p(&bytes);
    let pairs = d.as_dict().unwrap();
    let values: Vec<i64> = pairs.iter().map(|(_, v)| v.as_i64().unwrap()).collect();
    assert_eq!(values, [2, 3, 4, 6, 7, 8]);
    assert_eq!(pairs[0].0, Value::Float(0.0));
    // One NaN object used twice as a key is one key, as in Python.
    let mut bytes = b"}(".to_vec();
    bytes.extend_from_slice(nan);
    bytes.extend_from_slice(b"\x94K\x01h\x00K\x02u.");
    let d = p(&bytes);
    assert_eq!(d.as_dict().unwrap().len(), 1);
    assert_eq!(d.as_dict().unwrap()[0].1, Value::Int(2));
    // Sets keep the first of equal elements, by the same rule.
    let d = p(b"\x8f(K\x01\x8c\x01a\x8c\x01aK\x01\x90.");
    assert_eq!(d, Value::Set(vec![Value::Int(1), s("a")].into()));
}

#[test]
fn keys_that_share_containers_compare_in_linear_time() {
    // t0 = (0.5, 0.5); t(k+1) = (tk, tk), 64 levels: as a tree, 2^64 leaves. Two such
    // chains built separately are equal keys of one dict; comparing them as trees would
    // never end.
    let chain = |bytes: &mut Vec<u8>| {
        bytes
            .extend_from_slice(b"G?\xe0\x00\x00\x00\x00\x00\x00G?\xe0\x00\x00\x00\x00\x00\x00\x86");
        for _ in 0..64 {
            bytes.extend_from_slice(b"2\x86");
        }
    };
    let mut bytes = b"}(".to_vec();
    chain(&mut bytes);
    bytes.extend_from_slice(b"K\x01");
    chain(&mut bytes);
    bytes.extend_from_slice(b"K\x02u.");
    let d = doc(&bytes);
    let v = d.root().to_value();
    let pairs = v.as_dict().unwrap();
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].1, Value::Int(2));
}

#[test]
fn a_list_referenced_many_times_is_built_once() {
    // [l] * 20000 with l a memoized list of 20000 elements: 4e8 element visits if each
    // reference were hashed again.
    let n = 20_000u32;
    let mut bytes = b"\x80\x04](".to_vec();
    bytes.extend(std::iter::repeat_n(b'N', n as usize));
    bytes.extend_from_slice(b"e\x94](");
    for _ in 0..n {
        bytes.extend_from_slice(b"h\x00");
    }
    bytes.extend_from_slice(b"e.");
    let v = p(&bytes);
    let outer = v.as_seq().unwrap();
    assert_eq!(outer.len(), n as usize);
    assert!(outer.iter().all(|l| l.identity() == outer[0].identity()));
    assert_eq!(outer[n as usize - 1].as_seq().unwrap().len(), n as usize);
}

mod fuzz {
    use super::super::*;
    use super::SNAPSHOT_LIKE;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(vramscope_testkit::props::config(2000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn mutated_pickles_never_panic(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            let mut bytes = SNAPSHOT_LIKE.to_vec();
            for (at, byte) in edits {
                let i = at % bytes.len();
                bytes[i] = byte;
            }
            let cut = cut % (bytes.len() + 1);
            let _ = parse(&bytes[..cut]);
            let _ = parse(&bytes);
        }

        #[test]
        fn opcode_soup_never_panics(
            ops in proptest::collection::vec(
                prop::sample::select(b"(.012NKMJ\x88\x89]})lt\x85\x86\x87aesudq\x94h\x8f\x90\x91G\x8a".to_vec()),
                0..64,
            ),
        ) {
            // Give every opcode that takes an argument a zero byte, so that more of the
            // soup is well formed and deeper paths of the machine are reached.
            let mut bytes = vec![0x80, 4];
            for op in ops {
                bytes.push(op);
                match op {
                    b'K' | b'q' | b'h' | 0x8a => bytes.push(0),
                    b'M' => bytes.extend_from_slice(&[0, 0]),
                    b'J' => bytes.extend_from_slice(&[0; 4]),
                    b'G' => bytes.extend_from_slice(&[0; 8]),
                    _ => {}
                }
            }
            let _ = parse(&bytes);
        }
    }
}

/// A sink that takes nothing, for streaming reads of inputs with no entries.
struct NoEntries(Vec<usize>, Vec<(usize, Standin)>);

impl EntrySink for NoEntries {
    fn entry(&mut self, _: ValueRef<'_>, _: usize, _: usize, _: usize) -> bool {
        false
    }
    fn read(&mut self) -> &mut Vec<usize> {
        &mut self.0
    }
    fn standins(&mut self) -> &mut Vec<(usize, Standin)> {
        &mut self.1
    }
    fn memory(&self) -> usize {
        0
    }
}

/// Every opcode that reads a length or an index from the input, with lengths near the top of
/// its field: 2^64 and 2^63 for the eight-byte ones, 2^32 and 2^31 for the four-byte ones.
/// Each input is protocol 5, the opcode, its field and a few bytes (15 bytes for the
/// eight-byte ones, as in issue 44).
fn sized_length_cases() -> Vec<(&'static str, Vec<u8>)> {
    use crate::opcodes::*;
    let mut cases = Vec::new();
    let near = |top: u128| -> Vec<u128> {
        let mut v: Vec<u128> = (1..=16).map(|k| top - k).collect();
        v.extend([top / 2 - 1, top / 2, top / 2 + 1, top / 2 + 9]);
        v
    };
    for op in [BINBYTES8, BINUNICODE8, BYTEARRAY8, FRAME] {
        for n in near(1 << 64) {
            let mut b = vec![0x80, 5, op];
            b.extend_from_slice(&(n as u64).to_le_bytes());
            b.extend_from_slice(b"N.N.");
            cases.push((opcode_name(op), b));
        }
    }
    for op in [BINUNICODE, BINBYTES, BINSTRING, LONG4, LONG_BINGET] {
        for n in near(1 << 32) {
            let mut b = vec![0x80, 5, b'N', op];
            b.extend_from_slice(&(n as u32).to_le_bytes());
            b.extend_from_slice(b"N.N.");
            cases.push((opcode_name(op), b));
        }
    }
    cases
}

/// Issue 44: a `BINBYTES8` (or `BINUNICODE8`, `BYTEARRAY8`) of 2^64 − 9 bytes or more made the
/// count of bytes a streaming read waits for wrap to a few bytes, and every reader spun
/// forever. Each sized opcode with lengths near the top of its field is an error in every way
/// of reading: whole, streamed in pieces of a known total, and of unknown length (as gzip data
/// is read), and the last two read no more than the input (they would read it again and again,
/// or all of an endless input, otherwise).
#[test]
fn lengths_near_the_top_of_their_field_are_errors_in_every_reader() {
    let limits = Limits::default();
    for (name, bytes) in sized_length_cases() {
        let whole = Document::parse_with_limits(&bytes, &limits);
        assert!(whole.is_err(), "{name} {bytes:02x?}: whole read succeeded");
        let (read, given) = read_unsized(&bytes, &limits);
        assert!(read.is_err(), "{name} {bytes:02x?}: unsized read succeeded");
        assert!(given <= 2 * bytes.len(), "{name}: {given} bytes read");
        for piece in [1, 3, 7, 64] {
            let mut at = 0;
            let mut calls = 0;
            let mut next = |window: &mut Vec<u8>| {
                calls += 1;
                assert!(calls < 1000, "{name}: asked for pieces past the input");
                let end = (at + piece).min(bytes.len());
                window.extend_from_slice(&bytes[at..end]);
                let gave = end > at;
                at = end;
                gave
            };
            let mut sink = NoEntries(Vec::new(), Vec::new());
            let streamed =
                parse_streaming_chunks(bytes.len(), &mut next, &limits, "device_traces", &mut sink);
            assert!(
                streamed.is_none(),
                "{name} {bytes:02x?}: streamed read succeeded"
            );
        }
        let mut sink = NoEntries(Vec::new(), Vec::new());
        let streamed = parse_streaming_read(
            &mut Counted {
                data: &bytes,
                chunk: 5,
                given: 0,
            },
            &limits,
            "device_traces",
            &mut sink,
        );
        assert!(
            streamed.is_none(),
            "{name} {bytes:02x?}: streamed unsized read succeeded"
        );
    }
}

/// A length past the end of an input of known size is the whole read's error, at once; one
/// past the largest input read, in an input of unknown size, is refused before any more of it
/// is read, naming the opcode and the length.
#[test]
fn a_length_past_the_input_is_refused_without_waiting_for_it() {
    let mut bytes = vec![0x80, 5, crate::opcodes::BINBYTES8];
    bytes.extend_from_slice(&(u64::MAX - 8).to_le_bytes());
    bytes.extend_from_slice(b"N.N.");
    let e = Document::parse_with_limits(&bytes, &Limits::default()).unwrap_err();
    assert_eq!(e.offset, 2);
    assert_eq!(
        e.kind,
        PickleErrorKind::Truncated {
            opcode: "BINBYTES8",
            needed: u64::MAX - 8,
            available: 4
        }
    );
    // Followed by an endless stream of zeros: refused after the first piece.
    struct Zeros<'c>(&'c std::cell::Cell<usize>);
    impl std::io::Read for Zeros<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            buf.fill(0);
            self.0.set(self.0.get() + buf.len());
            Ok(buf.len())
        }
    }
    let zeros = std::cell::Cell::new(0);
    let head = &bytes[..11];
    let mut open =
        || -> Box<dyn std::io::Read + '_> { Box::new(std::io::Read::chain(head, Zeros(&zeros))) };
    let e = Document::parse_read(&mut open, &Limits::default()).unwrap_err();
    assert_eq!(e.offset, 2);
    assert!(e.to_string().contains("past the largest input read"), "{e}");
    assert!(
        zeros.get() <= 4 << 20,
        "{} bytes of zeros read",
        zeros.get()
    );
}
