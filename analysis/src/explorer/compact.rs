//! The compact forms of the HTML page's bulkiest data, base64 strings of LEB128 varints: a
//! moment's segment map, which the page's script decodes when the cursor first shows that
//! moment (`mapOf` in `explorer.js`), and the step marks, which it decodes at load.
//!
//! As JSON, a segment row cost about 70 bytes and a block about 30, so a trace with 51k
//! segments made a 51.5 MB page, nearly all of it segment maps (issue 36; 43.3 MB for the
//! 51,200 segments of `tests/data/gen_many_segments.py`). The page draws at
//! most [`MAX_SEGMENT_ROWS`](super::MAX_SEGMENT_ROWS) rows, so only those are
//! carried, and in this form a row costs about 10 bytes and a block about 8, in base64. The
//! stream is: the number of rows; then per row, its address less the previous row's (rows
//! are in address order; the first row's address as it is), its size, its flags (1: small
//! pool, 2: expandable) and its number of blocks; then per block, its offset less the
//! previous block's in the row (blocks are in address order; the first block's offset as
//! it is), its size and its group index times two plus 1 when it waits to be freed.
//! [`decode`] reads it back, as the script does, for the tests.
//!
//! Step marks, about 55 bytes each as JSON, grow with the trace: a generated trace of 374k
//! events has 5,146 inferred steps. [`encode_steps`] writes them in about 4 bytes each and
//! thins them past [`MAX_STEPS`].

use serde::Serializer;

use super::{SegmentRow, StepPos, MAX_STEPS};

/// Flag of a small-pool row.
const SMALL: u64 = 1;

/// Flag of a mapped run of an expandable segment.
const EXPANDABLE: u64 = 2;

/// The rows as the page carries them: varints, in base64.
pub fn encode(rows: &[SegmentRow]) -> String {
    let mut bytes = Vec::with_capacity(rows.len() * 8);
    put(&mut bytes, rows.len() as u64);
    let mut previous = 0u64;
    for row in rows {
        put(&mut bytes, row.addr.wrapping_sub(previous));
        previous = row.addr;
        put(&mut bytes, row.size);
        let flags =
            if row.pool == "s" { SMALL } else { 0 } | if row.expandable { EXPANDABLE } else { 0 };
        put(&mut bytes, flags);
        let blocks = row.blocks.chunks_exact(4);
        put(&mut bytes, blocks.len() as u64);
        let mut offset = 0u64;
        for b in blocks {
            put(&mut bytes, b[0].wrapping_sub(offset));
            offset = b[0];
            put(&mut bytes, b[1]);
            put(&mut bytes, b[3].saturating_mul(2) | (b[2] & 1));
        }
    }
    base64(&bytes)
}

/// Serializes the rows as [`encode`] writes them (for `#[serde(serialize_with)]`).
pub fn serialize<S: Serializer>(rows: &[SegmentRow], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&encode(rows))
}

/// The step marks as the page carries them: thinned to at most [`MAX_STEPS`] (the steps whose
/// number is a multiple of the smallest of 1, 2, 5, 10, 20… that is enough), then their count
/// and, per step, its number and position less the previous step's, zigzag-coded (so that a
/// list out of order comes through too), as varints in base64. Labels are left out: the page
/// does not show them.
pub fn encode_steps(steps: &[StepPos]) -> String {
    let every = step_stride(steps);
    let kept: Vec<&StepPos> = steps.iter().filter(|s| s.step % every == 0).collect();
    let mut bytes = Vec::with_capacity(kept.len() * 4 + 8);
    put(&mut bytes, kept.len() as u64);
    let (mut step, mut pos) = (0u64, 0u64);
    for s in kept {
        put(&mut bytes, zigzag(s.step.wrapping_sub(step)));
        put(&mut bytes, zigzag(s.pos.wrapping_sub(pos)));
        (step, pos) = (s.step, s.pos);
    }
    base64(&bytes)
}

/// The smallest of 1, 2, 5, 10, 20… whose multiples among the step numbers are at most
/// [`MAX_STEPS`].
fn step_stride(steps: &[StepPos]) -> u64 {
    let mut base = 1u64;
    loop {
        for m in [1, 2, 5] {
            let every = base.saturating_mul(m);
            let kept = steps.iter().filter(|s| s.step % every == 0).count();
            if kept <= MAX_STEPS || every == u64::MAX {
                return every;
            }
        }
        base = base.saturating_mul(10);
    }
}

/// A difference as an unsigned number: 0, -1, 1, -2, 2… as 0, 1, 2, 3, 4…
fn zigzag(delta: u64) -> u64 {
    let signed = delta as i64;
    ((signed << 1) ^ (signed >> 63)) as u64
}

/// Serializes the step marks as [`encode_steps`] writes them (for `#[serde(serialize_with)]`).
pub fn serialize_steps<S: Serializer>(steps: &[StepPos], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&encode_steps(steps))
}

/// The step marks of `text` as `(step, position)`, as the page's script reads them; `None`
/// when it is not what [`encode_steps`] writes.
pub fn decode_steps(text: &str) -> Option<Vec<(u64, u64)>> {
    let bytes = unbase64(text)?;
    let mut reader = Varints {
        bytes: &bytes,
        at: 0,
    };
    let count = reader.next()?;
    let (mut step, mut pos) = (0u64, 0u64);
    let mut out = Vec::new();
    for _ in 0..count {
        step = step.wrapping_add(unzigzag(reader.next()?));
        pos = pos.wrapping_add(unzigzag(reader.next()?));
        out.push((step, pos));
    }
    Some(out)
}

/// The difference [`zigzag`] coded.
fn unzigzag(v: u64) -> u64 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}

/// A reader of LEB128 varints.
struct Varints<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Varints<'_> {
    /// The next varint; `None` past the end or past ten bytes.
    fn next(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            value |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
}

/// The rows of `text`, as the page's script reads them; `None` when it is not what
/// [`encode`] writes.
pub fn decode(text: &str) -> Option<Vec<SegmentRow>> {
    let bytes = unbase64(text)?;
    let mut reader = Varints {
        bytes: &bytes,
        at: 0,
    };
    let mut next = || reader.next();
    let count = next()?;
    let mut rows = Vec::new();
    let mut previous = 0u64;
    for _ in 0..count {
        let addr = previous.wrapping_add(next()?);
        previous = addr;
        let size = next()?;
        let flags = next()?;
        let blocks = next()?;
        let mut row = SegmentRow {
            addr,
            size,
            pool: if flags & SMALL != 0 { "s" } else { "L" },
            expandable: flags & EXPANDABLE != 0,
            blocks: Vec::new(),
        };
        let mut offset = 0u64;
        for _ in 0..blocks {
            offset = offset.wrapping_add(next()?);
            let size = next()?;
            let tagged = next()?;
            row.blocks
                .extend_from_slice(&[offset, size, tagged & 1, tagged >> 1]);
        }
        rows.push(row);
    }
    Some(rows)
}

/// Appends `value` as an LEB128 varint: seven bits a byte, low first, the high bit set on
/// every byte but the last.
fn put(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The base64 alphabet of RFC 4648, which the browser's `atob` reads.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64, padded with `=`.
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bytes of base64 `text`; `None` when it is not base64.
fn unbase64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut n, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        n = n << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
            n &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        addr: u64,
        size: u64,
        pool: &'static str,
        expandable: bool,
        blocks: &[u64],
    ) -> SegmentRow {
        SegmentRow {
            addr,
            size,
            pool,
            expandable,
            blocks: blocks.to_vec(),
        }
    }

    #[test]
    fn rows_come_back_as_they_went() {
        let rows = vec![
            row(
                0x7f00_0000_0000,
                2 << 20,
                "s",
                false,
                &[0, 512, 0, 3, 4096, 1024, 1, 0],
            ),
            row(0x7f00_0020_0000, 20 << 20, "L", true, &[]),
            row(
                u64::MAX - 7,
                u64::MAX,
                "L",
                false,
                &[u64::MAX, u64::MAX, 1, u32::MAX.into()],
            ),
        ];
        let text = encode(&rows);
        assert!(text.bytes().all(|b| ALPHABET.contains(&b) || b == b'='));
        assert_eq!(decode(&text), Some(rows));
        assert_eq!(decode(&encode(&[])), Some(Vec::new()));
    }

    #[test]
    fn base64_is_the_browsers() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
        for n in 0..40u8 {
            let bytes: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            assert_eq!(unbase64(&base64(&bytes)), Some(bytes));
        }
    }

    #[test]
    fn steps_come_back_and_are_thinned_past_the_limit() {
        let step = |step: u64, pos: u64| StepPos {
            step,
            pos,
            label: "mark_step".to_string(),
        };
        let few = vec![
            step(1, 5),
            step(2, 46),
            step(7, 40),
            step(u64::MAX, 1 << 40),
        ];
        let text = encode_steps(&few);
        let want: Vec<(u64, u64)> = few.iter().map(|s| (s.step, s.pos)).collect();
        assert_eq!(decode_steps(&text), Some(want));
        // 250,000 steps: every fifth is kept (every second would leave 125,000).
        let many: Vec<StepPos> = (1..=250_000).map(|i| step(i, i * 40)).collect();
        let kept = decode_steps(&encode_steps(&many)).unwrap();
        assert_eq!(kept.len(), 50_000);
        assert!(kept.iter().all(|&(s, p)| s % 5 == 0 && p == s * 40));
        assert!(encode_steps(&many).len() < 50_000 * 6);
    }

    #[test]
    fn a_row_costs_a_few_bytes() {
        let rows: Vec<SegmentRow> = (0..2000u64)
            .map(|i| {
                row(
                    0x7f00_0000_0000 + i * (2 << 20),
                    2 << 20,
                    "s",
                    false,
                    &[0, 512, 0, 7],
                )
            })
            .collect();
        let text = encode(&rows);
        // As JSON, such a row with its block was 93 bytes.
        let json = serde_json::to_string(&rows).unwrap();
        assert!(json.len() > 2000 * 90, "{} bytes", json.len());
        assert!(text.len() < 2000 * 20, "{} bytes", text.len());
        assert!(
            decode(&text[..text.len() - 8]).is_none(),
            "a cut map is an error"
        );
    }
}
