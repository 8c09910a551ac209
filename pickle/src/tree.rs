//! Turning a [`Document`] into a tree of [`Value`]s, each shared object built once.
//!
//! [`super::ValueRef::to_value`] (and so `super::parse`) calls [`ValueBuilder`]; it reads the
//! tables of `super::document` directly. Dicts keep one pair per distinct key and sets one
//! element per distinct value, as in Python; [`KeyIds`] finds the repeats in time linear in
//! the document however its containers are shared.

use std::rc::Rc;

use rustc_hash::FxHashMap;

use super::document::{kind, Document, Ref};
use super::value::Value;

/// Turns document values into [`Value`]s, building each shared object once.
///
/// Every step is linear in the document: a list referenced many times is found again by the
/// position of its elements, not by hashing them anew, and the repeated keys of dicts and
/// elements of sets are found through [`KeyIds`], not by comparing values pairwise.
pub(super) struct ValueBuilder<'d> {
    doc: &'d Document,
    /// Finished strings, byte strings, big integers, dicts and sets, by reference.
    built: FxHashMap<Ref, Value>,
    /// Finished lists and tuples by kind and the position and length of their elements, which
    /// containers that share elements share.
    by_slot: FxHashMap<(u32, u32, u32), Value>,
    /// Finished lists and tuples by kind and elements, looked up once per position: equal
    /// lists whose elements the reader stored twice still become one allocation.
    sequences: FxHashMap<(u32, &'d [Ref]), Value>,
    keys: KeyIds<'d>,
}

impl<'d> ValueBuilder<'d> {
    pub(super) fn new(doc: &'d Document) -> ValueBuilder<'d> {
        ValueBuilder {
            doc,
            built: FxHashMap::default(),
            by_slot: FxHashMap::default(),
            sequences: FxHashMap::default(),
            keys: KeyIds::new(doc),
        }
    }

    /// Builds the value `r`. The document has no cycles and bounded depth (see
    /// [`Document::check`]), so the recursion ends.
    pub(super) fn build(&mut self, r: Ref) -> Value {
        let doc = self.doc;
        let i = r.index();
        match r.kind() {
            kind::SMALL_INT => return Value::Int(r.small_value()),
            kind::CONST if r == Ref::NONE => return Value::None,
            kind::CONST => return Value::Bool(r == Ref::TRUE),
            kind::INT => return Value::Int(doc.ints[i]),
            kind::FLOAT => return Value::Float(doc.floats[i]),
            kind::LIST | kind::TUPLE => {
                let c = doc.containers[i];
                let slot = (r.kind(), c.start, c.len);
                if let Some(v) = self.by_slot.get(&slot) {
                    return v.clone();
                }
                let key = (r.kind(), doc.elements(r));
                let v = match self.sequences.get(&key) {
                    Some(v) => v.clone(),
                    None => {
                        let items: Rc<[Value]> = key.1.iter().map(|&e| self.build(e)).collect();
                        let v = if r.kind() == kind::TUPLE {
                            Value::Tuple(items)
                        } else {
                            Value::List(items)
                        };
                        self.sequences.insert(key, v.clone());
                        v
                    }
                };
                self.by_slot.insert(slot, v.clone());
                return v;
            }
            _ => {}
        }
        if let Some(v) = self.built.get(&r) {
            return v.clone();
        }
        let v = match r.kind() {
            kind::STR => Value::Str(Rc::from(doc.text_of(i))),
            kind::BYTES => Value::Bytes(Rc::from(doc.blob_of(i))),
            kind::BIG_INT => Value::BigInt(Rc::from(doc.blob_of(i))),
            kind::SET | kind::FROZEN_SET => {
                let elements = doc.elements(r);
                let ids: Vec<u32> = elements.iter().map(|&e| self.keys.id(e)).collect();
                let items: Rc<[Value]> = match distinct(&ids) {
                    None => elements.iter().map(|&e| self.build(e)).collect(),
                    Some(kept) => kept
                        .into_iter()
                        .map(|(first, _)| self.build(elements[first]))
                        .collect(),
                };
                if r.kind() == kind::SET {
                    Value::Set(items)
                } else {
                    Value::FrozenSet(items)
                }
            }
            _ => {
                let elements = doc.elements(r);
                let ids: Vec<u32> = elements
                    .chunks_exact(2)
                    .map(|pair| self.keys.id(pair[0]))
                    .collect();
                let pairs: Rc<[(Value, Value)]> = match distinct(&ids) {
                    None => elements
                        .chunks_exact(2)
                        .map(|pair| (self.build(pair[0]), self.build(pair[1])))
                        .collect(),
                    // A key set twice keeps its first place and its last value, as in Python.
                    Some(kept) => kept
                        .into_iter()
                        .map(|(first, last)| {
                            (
                                self.build(elements[2 * first]),
                                self.build(elements[2 * last + 1]),
                            )
                        })
                        .collect(),
                };
                Value::Dict(pairs)
            }
        };
        self.built.insert(r, v.clone());
        v
    }
}

/// When `ids` has repeats, the first and last position of each distinct id, in the order of
/// first positions; `None` when all are distinct.
fn distinct(ids: &[u32]) -> Option<Vec<(usize, usize)>> {
    let mut seen: FxHashMap<u32, usize> = FxHashMap::default();
    let mut kept: Vec<(usize, usize)> = Vec::with_capacity(ids.len());
    let mut repeated = false;
    for (i, &id) in ids.iter().enumerate() {
        match seen.get(&id) {
            Some(&k) => {
                kept[k].1 = i;
                repeated = true;
            }
            None => {
                seen.insert(id, kept.len());
                kept.push((i, i));
            }
        }
    }
    repeated.then_some(kept)
}

/// A scalar as [`KeyIds`] compares it.
#[derive(PartialEq, Eq, Hash)]
enum Atom<'d> {
    /// `None`, `False` or `True`, by the payload of their [`Ref`].
    Const(u32),
    /// An integer that fits in 64 bits.
    Int(i64),
    /// A float by its bits, with `-0.0` counted as `0.0`.
    Float(u64),
    /// A NaN, which equals only itself (one value referenced twice): by its index.
    Nan(usize),
    /// A text string.
    Str(&'d str),
    /// A byte string.
    Bytes(&'d [u8]),
    /// An integer too large for 64 bits, by its minimal bytes.
    BigInt(&'d [u8]),
}

/// Numbers values so that two values get the same number exactly when they are equal as
/// [`Value`]s compare them (structurally, in order, after a dict or set drops its repeated
/// keys), except that a NaN equals itself when it is the same object, as in Python.
///
/// Each string, byte string and container of the document is numbered once, from the numbers
/// of its elements, so numbering every key of a document takes time linear in its size
/// however its containers are shared, where comparing values pairwise could take time
/// quadratic in a dict's size and exponential in the nesting of shared containers.
struct KeyIds<'d> {
    doc: &'d Document,
    /// Numbers of scalars by content.
    atoms: FxHashMap<Atom<'d>, u32>,
    /// Numbers of containers by kind and the numbers of their (kept) elements.
    shapes: FxHashMap<(u32, Vec<u32>), u32>,
    /// Numbers already given to strings, byte strings, big integers and containers.
    known: FxHashMap<Ref, u32>,
    next: u32,
}

impl<'d> KeyIds<'d> {
    fn new(doc: &'d Document) -> KeyIds<'d> {
        KeyIds {
            doc,
            atoms: FxHashMap::default(),
            shapes: FxHashMap::default(),
            known: FxHashMap::default(),
            next: 0,
        }
    }

    /// The next unused number.
    fn fresh(next: &mut u32) -> u32 {
        let id = *next;
        *next += 1;
        id
    }

    fn atom(&mut self, atom: Atom<'d>) -> u32 {
        let next = &mut self.next;
        *self.atoms.entry(atom).or_insert_with(|| Self::fresh(next))
    }

    /// The number of the value `r`.
    fn id(&mut self, r: Ref) -> u32 {
        let doc = self.doc;
        let i = r.index();
        match r.kind() {
            kind::SMALL_INT => return self.atom(Atom::Int(r.small_value())),
            kind::CONST => return self.atom(Atom::Const(i as u32)),
            kind::INT => return self.atom(Atom::Int(doc.ints[i])),
            kind::FLOAT => {
                let f = doc.floats[i];
                let atom = if f.is_nan() {
                    Atom::Nan(i)
                } else if f == 0.0 {
                    Atom::Float(0)
                } else {
                    Atom::Float(f.to_bits())
                };
                return self.atom(atom);
            }
            _ => {}
        }
        if let Some(&id) = self.known.get(&r) {
            return id;
        }
        let id = match r.kind() {
            kind::STR => self.atom(Atom::Str(doc.text_of(i))),
            kind::BYTES => self.atom(Atom::Bytes(doc.blob_of(i))),
            kind::BIG_INT => self.atom(Atom::BigInt(doc.blob_of(i))),
            k => {
                let ids: Vec<u32> = doc.elements(r).iter().map(|&e| self.id(e)).collect();
                let kept: Vec<u32> = match k {
                    kind::SET | kind::FROZEN_SET => match distinct(&ids) {
                        None => ids,
                        Some(kept) => kept.into_iter().map(|(first, _)| ids[first]).collect(),
                    },
                    kind::DICT => {
                        let keys: Vec<u32> = ids.iter().step_by(2).copied().collect();
                        match distinct(&keys) {
                            None => ids,
                            Some(kept) => kept
                                .into_iter()
                                .flat_map(|(first, last)| [ids[2 * first], ids[2 * last + 1]])
                                .collect(),
                        }
                    }
                    _ => ids,
                };
                let next = &mut self.next;
                *self
                    .shapes
                    .entry((k, kept))
                    .or_insert_with(|| Self::fresh(next))
            }
        };
        self.known.insert(r, id);
        id
    }
}
