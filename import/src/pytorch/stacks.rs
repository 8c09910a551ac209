//! Call sites from the stacks of a PyTorch snapshot: [`Stacks`] turns each `frames` list into
//! a call site of `super::super::sites::SiteTable`, converting every list, frame and string
//! the pickle shares once.
//!
//! `super::read_entry` and `super::read_segment` call [`Stacks::site`] for every trace entry
//! and block. While `super::stream` streams trace entries, the lists and frame dicts made for
//! an entry are dropped after it: they are not remembered by identity, and what they became is
//! handed back to the reader as `vramscope_pickle::Standin`s for the memo to keep, while the
//! containers from before the entry that were read are reported so that the reader can make
//! sure they do not change.

use rustc_hash::FxHashMap;
use vramscope_model::{Frame, Id, SiteId};

use super::{fields, Fault, Loc};
use crate::sites::SiteTable;
use vramscope_pickle::{FastList, FastValue, Standin, ValueRef};

/// Converts stacks into call sites. The pickle shares frame lists, frame dicts and strings
/// through its memo, and the reader stores equal frame lists once, so all are remembered by
/// identity: a shared list is converted once, a new list made of known frames is looked up by
/// frame numbers, a new frame dict by the numbers of its strings, and each string's text is
/// looked at once, however many frames share it.
///
/// The model keeps every call site's frames as text of their own, so a frame the pickle
/// shares is copied once per place a call site holds it. Two bounds keep a small file from
/// becoming a huge site table: a call site keeps the innermost [`Stacks::MAX_FRAMES`] frames
/// of its stack (and one frame saying how many outer ones it left out), and the frames of all
/// call sites together may hold at most [`Stacks::max_bytes`] bytes, past which the import
/// fails naming the stack. Both are checked before any text is copied.
pub(super) struct Stacks {
    pub(super) table: SiteTable,
    /// Site of each frame list seen, by the list's identity.
    by_list: FxHashMap<usize, Option<SiteId>>,
    /// Site of each frame list made for a streamed entry, by its elements when they are all
    /// older than the entry (or stand-ins), which the reader keeps unchanged.
    by_elements: FxHashMap<Box<[u32]>, Option<SiteId>>,
    /// Number of each frame dict seen, by the dict's identity.
    by_dict: FxHashMap<usize, u32>,
    /// Number of each string seen, by the string's identity.
    by_string: FxHashMap<usize, u32>,
    /// Number of each distinct text, by content.
    by_text: FxHashMap<std::rc::Rc<str>, u32>,
    /// The distinct texts, by number.
    texts: Vec<std::rc::Rc<str>>,
    /// Number of each distinct frame, by the numbers of its file and function and its line.
    by_frame: FxHashMap<(u32, u32, u32), u32>,
    /// The distinct frames, by number: file, line and function.
    frames: Vec<(u32, u32, u32)>,
    /// Site of each stack seen, by its frame numbers.
    by_numbers: FxHashMap<Vec<u32>, Option<SiteId>>,
    /// Bytes held by the frames of the call sites so far.
    pub(super) bytes: usize,
    /// The most bytes they may hold ([`Stacks::max_bytes`]); the annotations' names are held
    /// to the same.
    pub(super) max_bytes: usize,
    /// While a streamed entry is converted: containers numbered from this one were made for
    /// it.
    pub(super) transient_from: Option<usize>,
    /// Containers from before the entry that converting it read.
    pub(super) read: Vec<usize>,
    /// What the entry's own frames lists and frame dicts became.
    pub(super) standins: Vec<(usize, Standin)>,
    /// A buffer for the elements of a list.
    elements: Vec<u32>,
    /// The bytes the keys of `by_elements` hold.
    element_bytes: usize,
    /// The distinct `user_metadata` strings of the entries, by tag number: the snapshot's
    /// tags ([`Stacks::tag`]).
    pub(super) tags: Vec<String>,
    /// The tag number of each of them.
    by_tag: FxHashMap<String, u32>,
}

impl Stacks {
    /// The most frames a call site keeps: the innermost ones (Python's default recursion
    /// limit is 1,000 frames, and C++ frames add a few to each).
    pub(super) const MAX_FRAMES: usize = 4096;
    /// The most bytes the frames of all call sites may hold together, whatever the file.
    pub(super) const MAX_BYTES: usize = 1 << 30;

    /// The most bytes the frames of all call sites of a pickle of `input_bytes` bytes may
    /// hold together: 64 MiB and 8 bytes per input byte, at most [`Stacks::MAX_BYTES`].
    /// PyTorch's snapshots need a fraction of their size (0.2 to 0.4 bytes per input byte in
    /// the shared traces); a file that shares one long file name among thousands of call
    /// sites would otherwise make gigabytes of copies from a few hundred kilobytes.
    pub(super) fn max_bytes(input_bytes: usize) -> usize {
        input_bytes
            .saturating_mul(8)
            .saturating_add(64 << 20)
            .min(Self::MAX_BYTES)
    }

    /// The tag of an entry's `user_metadata` string (PyTorch's custom allocation metadata,
    /// which `attach()` sets to `vramscope:phase=...;module=...`), so that what reads tags
    /// (`Category::from_tag`, `LiveMark::parse`) reads it: `None` for none or an empty one.
    pub(super) fn tag(&mut self, metadata: Option<&str>) -> Option<Id> {
        let text = metadata.filter(|t| !t.is_empty())?;
        let next = self.tags.len() as u32;
        let id = match self.by_tag.get(text) {
            Some(&id) => id,
            None => {
                self.by_tag.insert(text.to_string(), next);
                self.tags.push(text.to_string());
                next
            }
        };
        Id::new(id)
    }

    /// Stacks for a pickle of `input_bytes` bytes (see [`Stacks::max_bytes`]).
    pub(super) fn new(framework_paths: &[String], input_bytes: usize) -> Stacks {
        let mut stacks = Stacks {
            max_bytes: Self::max_bytes(input_bytes),
            table: SiteTable::new(framework_paths),
            by_list: FxHashMap::default(),
            by_elements: FxHashMap::default(),
            by_dict: FxHashMap::default(),
            by_string: FxHashMap::default(),
            by_text: FxHashMap::default(),
            texts: Vec::new(),
            by_frame: FxHashMap::default(),
            frames: Vec::new(),
            by_numbers: FxHashMap::default(),
            bytes: 0,
            transient_from: None,
            read: Vec::new(),
            standins: Vec::new(),
            elements: Vec::new(),
            element_bytes: 0,
            tags: Vec::new(),
            by_tag: FxHashMap::default(),
        };
        // Texts 0 and 1: the file and the function of a frame that lacks them.
        stacks.text_number("??");
        stacks.text_number("");
        stacks
    }

    /// The bytes of memory the tables hold besides the frames' text, roughly.
    pub(super) fn memory(&self) -> usize {
        (self.by_list.len() + self.by_dict.len() + self.by_string.len()) * 24
            + (self.by_elements.len() + self.by_numbers.len()) * 64
            + self.element_bytes
            + self.frames.len() * 40
            + self.texts.iter().map(|t| t.len() + 48).sum::<usize>()
    }

    /// Whether `value` is a container made for the streamed entry being converted.
    fn transient(&self, value: ValueRef<'_>) -> bool {
        match (self.transient_from, value.container_index()) {
            (Some(from), Some(c)) => c >= from,
            _ => false,
        }
    }

    /// Notes that converting a streamed entry read `value`, a container from before it.
    fn note_read(&mut self, value: ValueRef<'_>) {
        if let (Some(_), Some(c)) = (self.transient_from, value.container_index()) {
            self.read.push(c);
        }
    }

    /// The number of the text `text`.
    fn text_number(&mut self, text: &str) -> u32 {
        if let Some(&n) = self.by_text.get(text) {
            return n;
        }
        let n = self.texts.len() as u32;
        let text: std::rc::Rc<str> = std::rc::Rc::from(text);
        self.texts.push(text.clone());
        self.by_text.insert(text, n);
        n
    }

    /// The number of the text of `value` when it is a string, else `absent`.
    fn string_number(&mut self, value: Option<ValueRef<'_>>, absent: u32) -> u32 {
        let Some((value, text)) = value.and_then(|v| v.as_str().map(|text| (v, text))) else {
            return absent;
        };
        let identity = value.identity();
        if let Some(&n) = identity.and_then(|id| self.by_string.get(&id)) {
            return n;
        }
        let n = self.text_number(text);
        if let Some(id) = identity {
            self.by_string.insert(id, n);
        }
        n
    }

    /// The number of the frame `frame` (`{filename, line, name}`; missing parts become `??`,
    /// 0 and an empty name), or `None` when it is not a dict.
    fn frame_number(&mut self, frame: ValueRef<'_>) -> Option<u32> {
        match frame.standin() {
            Some(Standin::Frame(n)) => return Some(n),
            Some(Standin::Site(_)) => return None,
            None => {}
        }
        let transient = self.transient(frame);
        let identity = if transient { None } else { frame.identity() };
        if let Some(n) = identity.and_then(|id| self.by_dict.get(&id)) {
            return Some(*n);
        }
        if !frame.is_dict() {
            return None;
        }
        if !transient {
            self.note_read(frame);
        }
        let [file, line, name] = fields(frame, ["filename", "line", "name"]);
        let line = match line.and_then(|v| v.as_i64()) {
            Some(i) => i.clamp(0, u32::MAX as i64) as u32,
            None => 0,
        };
        let key = (
            self.string_number(file, 0),
            line,
            self.string_number(name, 1),
        );
        let n = match self.by_frame.get(&key) {
            Some(&n) => n,
            None => {
                let n = self.frames.len() as u32;
                self.frames.push(key);
                self.by_frame.insert(key, n);
                n
            }
        };
        if let Some(id) = identity {
            self.by_dict.insert(id, n);
        }
        if let (true, Some(c)) = (transient, frame.container_index()) {
            self.standins.push((c, Standin::Frame(n)));
        }
        Some(n)
    }

    /// The frame number `n` as the model keeps it.
    fn frame(&self, n: u32) -> Frame {
        let (file, line, function) = self.frames[n as usize];
        Frame {
            file: self.texts[file as usize].to_string(),
            line,
            function: self.texts[function as usize].to_string(),
        }
    }

    /// The bytes frame number `n` holds in a call site.
    fn frame_bytes(&self, n: u32) -> usize {
        let (file, _, function) = self.frames[n as usize];
        std::mem::size_of::<Frame>()
            + self.texts[file as usize].len()
            + self.texts[function as usize].len()
    }

    /// The call site of the stack `frames` (a list of frame dicts, innermost first) at `loc`;
    /// `None` when it is absent or has no frames.
    pub(super) fn site(
        &mut self,
        frames: Option<ValueRef<'_>>,
        loc: Loc,
    ) -> Result<Option<SiteId>, Fault> {
        let Some(frames) = frames.filter(|v| !v.is_none()) else {
            return Ok(None);
        };
        if let Some(Standin::Site(n)) = frames.standin() {
            return Ok(n.checked_sub(1));
        }
        if self.transient(frames) {
            return self.transient_site(frames, loc);
        }
        let identity = frames.identity();
        if let Some(&site) = identity.and_then(|id| self.by_list.get(&id)) {
            // Another list with the same frames (the reader stores equal lists once) may be
            // the one converted: this one must not change afterwards either.
            self.note_read(frames);
            return Ok(site);
        }
        let list = frames
            .as_seq()
            .ok_or_else(|| loc.wrong("frames", "a list", frames))?;
        self.note_read(frames);
        let numbers = self.numbers(list.iter(), loc)?;
        let site = self.site_of(numbers, loc)?;
        if let Some(id) = identity {
            self.by_list.insert(id, site);
        }
        Ok(site)
    }

    /// The call site of a frames list made for the streamed entry being converted, which is
    /// handed back as a stand-in and remembered by its elements when they are stable.
    fn transient_site(&mut self, frames: ValueRef<'_>, loc: Loc) -> Result<Option<SiteId>, Fault> {
        let list = frames
            .as_seq()
            .ok_or_else(|| loc.wrong("frames", "a list", frames))?;
        let mut elements = std::mem::take(&mut self.elements);
        let stable = list.stable_elements(self.transient_from.unwrap_or(0), &mut elements);
        let site = self.site_by_elements(
            stable.then_some(elements.as_slice()),
            list.iter(),
            frames.container_index(),
            loc,
        );
        self.elements = elements;
        site
    }

    /// The call site of `frames`, the frames of an entry that the pickle reader's fast path
    /// decoded: the site, the stand-in and the reads that [`Stacks::site`] gives for the same
    /// entry read whole.
    pub(super) fn fast_site(
        &mut self,
        frames: Option<FastValue<'_>>,
        loc: Loc,
    ) -> Result<Option<SiteId>, Fault> {
        match frames {
            None => Ok(None),
            Some(FastValue::Doc(v)) => self.site(Some(v), loc),
            Some(FastValue::List(list)) => self.fast_transient_site(list, loc),
            Some(other) => Err(loc.wrong("frames", "a list", other)),
        }
    }

    /// [`Stacks::transient_site`] of a frames list the fast path decoded.
    fn fast_transient_site(
        &mut self,
        list: FastList<'_>,
        loc: Loc,
    ) -> Result<Option<SiteId>, Fault> {
        let stable = list.stable_elements(self.transient_from.unwrap_or(0));
        self.site_by_elements(stable, list.iter(), Some(list.container_index()), loc)
    }

    /// The call site of the frames `frames` of a list made for the streamed entry (numbered
    /// `container`), whose elements' key is `stable` when it stays valid.
    fn site_by_elements<'d>(
        &mut self,
        stable: Option<&[u32]>,
        frames: impl ExactSizeIterator<Item = ValueRef<'d>>,
        container: Option<usize>,
        loc: Loc,
    ) -> Result<Option<SiteId>, Fault> {
        let cached = stable.and_then(|elements| self.by_elements.get(elements).copied());
        // On a hit, the list's frame dicts were read (and noted) when it was first converted.
        let site = match cached {
            Some(site) => site,
            None => {
                let numbers = self.numbers(frames, loc)?;
                let site = self.site_of(numbers, loc)?;
                if let Some(elements) = stable {
                    self.element_bytes += elements.len() * 4;
                    self.by_elements.insert(elements.into(), site);
                }
                site
            }
        };
        if let Some(c) = container {
            let n = site
                .map_or(Some(0), |s| s.checked_add(1))
                .unwrap_or(u32::MAX);
            self.standins.push((c, Standin::Site(n)));
        }
        Ok(site)
    }

    /// The frame numbers of the frames `list` at `loc`.
    fn numbers<'d>(
        &mut self,
        list: impl ExactSizeIterator<Item = ValueRef<'d>>,
        loc: Loc,
    ) -> Result<Vec<u32>, Fault> {
        let mut numbers = Vec::with_capacity(list.len());
        for (k, frame) in list.enumerate() {
            numbers.push(self.frame_number(frame).ok_or_else(|| {
                loc.fault(
                    &format!("frames[{k}]"),
                    format!(
                        "expected a dict with filename, line and name, found {}",
                        frame.type_name()
                    ),
                )
            })?);
        }
        Ok(numbers)
    }

    /// The call site of the stack of frame numbers `numbers` at `loc`, interned when new.
    fn site_of(&mut self, numbers: Vec<u32>, loc: Loc) -> Result<Option<SiteId>, Fault> {
        if let Some(&site) = self.by_numbers.get(&numbers) {
            return Ok(site);
        }
        let kept = &numbers[..numbers.len().min(Self::MAX_FRAMES)];
        let left_out = numbers.len() - kept.len();
        let note = (left_out > 0).then(|| Frame {
            file: "??".to_string(),
            line: 0,
            function: format!(
                "<{left_out} outer frames left out: a call site keeps its {} innermost>",
                Self::MAX_FRAMES
            ),
        });
        // Counted before any text is copied: each frame, and once more the largest, which
        // stands for the copy of the primary frame the call site keeps.
        let frame_bytes = |n: &u32| self.frame_bytes(*n);
        let largest = kept.iter().map(frame_bytes).max().unwrap_or(0);
        let bytes = kept
            .iter()
            .map(frame_bytes)
            .chain([largest])
            .chain(
                note.iter()
                    .map(|f| std::mem::size_of::<Frame>() + f.function.len() + 2),
            )
            .fold(0usize, usize::saturating_add);
        match self.bytes.checked_add(bytes) {
            Some(total) if total <= self.max_bytes => self.bytes = total,
            _ => {
                return Err(loc.fault(
                    "frames",
                    format!(
                        "the call stacks hold more than {} MiB of frames (the limit for this file: 64 MiB and 8 bytes per byte of the file, at most {} MiB; a frame the file shares is copied into every call site that holds it)",
                        self.max_bytes >> 20,
                        Self::MAX_BYTES >> 20
                    ),
                ))
            }
        }
        let stack = kept.iter().map(|&n| self.frame(n)).chain(note).collect();
        let site = self.table.intern(stack);
        self.by_numbers.insert(numbers, site);
        Ok(site)
    }
}
