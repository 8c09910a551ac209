//! The compact form of a moment's segment map in the HTML page: one base64 string of
//! LEB128 varints per moment, which the page's script decodes when the cursor first shows
//! that moment (`mapOf` in `explorer.js`).
//!
//! As JSON, a segment row cost about 70 bytes and a block about 30, so a trace with 51k
//! segments made a 51.5 MB page, nearly all of it segment maps (issue 36). The page draws at
//! most [`MAX_SEGMENT_ROWS`](super::explorer::MAX_SEGMENT_ROWS) rows, so only those are
//! carried, and in this form a row costs about 10 bytes and a block about 8, in base64. The
//! stream is: the number of rows; then per row, its address less the previous row's (rows
//! are in address order; the first row's address as it is), its size, its flags (1: small
//! pool, 2: expandable) and its number of blocks; then per block, its offset less the
//! previous block's in the row (blocks are in address order; the first block's offset as
//! it is), its size and its group index times two plus 1 when it waits to be freed.
//! [`decode`] reads it back, as the script does, for the tests.

use serde::Serializer;

use super::explorer::SegmentRow;

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

/// The rows of `text`, as the page's script reads them; `None` when it is not what
/// [`encode`] writes.
pub fn decode(text: &str) -> Option<Vec<SegmentRow>> {
    let bytes = unbase64(text)?;
    let mut at = 0usize;
    let mut next = || -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = *bytes.get(at)?;
            at += 1;
            value |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    };
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
