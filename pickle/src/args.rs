//! Decoding the arguments of the opcodes that carry numbers or text in a form of their own:
//! little-endian and decimal integers of any size, `raw-unicode-escape` text and quoted,
//! escaped byte strings.
//!
//! `super::machine` calls these with an opcode's argument bytes and turns a `None` into a
//! `BadArgument` error naming the opcode; [`quoted`] shortens an argument for that message.

/// The most decimal digits an `INT` or `LONG` opcode may have: Python's own default limit
/// (`sys.int_info.default_max_str_digits`) for converting text to an integer, which its
/// unpickler applies to these opcodes too.
pub(super) const MAX_DECIMAL_DIGITS: usize = 4300;

/// An integer read from the input.
pub(super) enum PyInt {
    /// One that fits in 64 bits.
    Fits(i64),
    /// Its minimal little-endian two's-complement bytes, when it does not.
    Big(Vec<u8>),
}

/// Decodes a little-endian two's-complement integer (the argument of `LONG1`/`LONG4`).
pub(super) fn int_from_le(bytes: &[u8]) -> PyInt {
    let mut len = bytes.len();
    // Drop sign-extension bytes that do not change the value.
    while len > 1 {
        let last = bytes[len - 1];
        let negative_below = bytes[len - 2] & 0x80 != 0;
        if (last == 0x00 && !negative_below) || (last == 0xff && negative_below) {
            len -= 1;
        } else {
            break;
        }
    }
    let bytes = &bytes[..len];
    if bytes.is_empty() {
        return PyInt::Fits(0);
    }
    if bytes.len() <= 8 {
        let fill = if bytes[bytes.len() - 1] & 0x80 != 0 {
            0xff
        } else {
            0
        };
        let mut le = [fill; 8];
        le[..bytes.len()].copy_from_slice(bytes);
        PyInt::Fits(i64::from_le_bytes(le))
    } else {
        PyInt::Big(bytes.to_vec())
    }
}

/// Parses a decimal integer of any size (the argument of the text `INT` and `LONG` opcodes),
/// nineteen digits at a time into 64-bit limbs.
pub(super) fn int_from_decimal(text: &str) -> Option<PyInt> {
    let text = text.trim();
    if let Ok(v) = text.parse::<i64>() {
        return Some(PyInt::Fits(v));
    }
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude in base 2^64, little-endian, from the most significant digits down.
    const CHUNK: usize = 19;
    let mut limbs: Vec<u64> = Vec::with_capacity(digits.len() / CHUNK + 1);
    let first = match digits.len() % CHUNK {
        0 => CHUNK,
        n => n,
    };
    let mut at = 0;
    let mut take = first;
    while at < digits.len() {
        let chunk = &digits.as_bytes()[at..at + take];
        let value = chunk
            .iter()
            .fold(0u64, |v, &d| v * 10 + u64::from(d - b'0'));
        let scale = 10u128.pow(take as u32);
        let mut carry = u128::from(value);
        for limb in limbs.iter_mut() {
            let v = u128::from(*limb) * scale + carry;
            *limb = v as u64;
            carry = v >> 64;
        }
        if carry > 0 {
            limbs.push(carry as u64);
        }
        at += take;
        take = CHUNK;
    }
    let mut magnitude: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    while magnitude.len() > 1 && magnitude[magnitude.len() - 1] == 0 {
        magnitude.pop();
    }
    // A zero byte on top makes the two's-complement form non-negative.
    magnitude.push(0);
    if negative {
        let mut carry = 1u16;
        for byte in magnitude.iter_mut() {
            let v = (!*byte) as u16 + carry;
            *byte = v as u8;
            carry = v >> 8;
        }
    }
    Some(int_from_le(&magnitude))
}

/// `text` in backquotes for an error message, cut after 40 characters so that a huge argument
/// does not make a huge message.
pub(super) fn quoted(text: &str) -> String {
    const SHOWN: usize = 40;
    match text.char_indices().nth(SHOWN) {
        None => format!("`{text}`"),
        Some((cut, _)) => format!("`{}…` ({} bytes)", &text[..cut], text.len()),
    }
}

/// Decodes Python's `raw-unicode-escape` (the argument of `UNICODE`): Latin-1 text with
/// `\uXXXX` and `\UXXXXXXXX` escapes.
pub(super) fn raw_unicode_unescape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' && i + 1 < bytes.len() && (bytes[i + 1] == b'u' || bytes[i + 1] == b'U') {
            let width = if bytes[i + 1] == b'u' { 4 } else { 8 };
            let hex = bytes.get(i + 2..i + 2 + width)?;
            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
            i += 2 + width;
        } else {
            out.push(b as char);
            i += 1;
        }
    }
    Some(out)
}

/// Decodes the quoted, backslash-escaped argument of the text `STRING` opcode.
pub(super) fn quoted_unescape(line: &[u8]) -> Option<Vec<u8>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() < 2 {
        return None;
    }
    let quote = line[0];
    if (quote != b'\'' && quote != b'"') || line[line.len() - 1] != quote {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'\\' | b'\'' | b'"' => out.push(e),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'v' => out.push(0x0b),
            b'x' => {
                let hex = body.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + (body[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            _ => {
                out.push(b'\\');
                out.push(e);
            }
        }
    }
    Some(out)
}
