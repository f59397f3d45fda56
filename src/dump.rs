//! A small hash in Redis's `DUMP` format, so that one `RESTORE key <unix-ms> <payload> REPLACE
//! ABSTTL` carries a whole lock write (the holder's count and its absolute deadline) to
//! replicas and the AOF: one propagated command instead of `HSET` + `PEXPIREAT`, which Redis
//! wraps in `MULTI`/`EXEC`. Plain Rust; `tests/dump.rs` checks the bytes and a live server
//! checks that every server of the matrix restores them as the same hash.
//!
//! The payload is a listpack-encoded hash (RDB type 16) with RDB version 10 (Redis 7.0, the
//! oldest server rlock supports; every later Redis and Valkey reads it), then the CRC-64 Redis
//! checks. Entries are encoded as Redis encodes them: a canonical decimal integer as an integer,
//! anything else as a string.

/// RDB type of a listpack-encoded hash.
const RDB_TYPE_HASH_LISTPACK: u8 = 16;
/// RDB version 10: Redis 7.0, the first with listpack hashes.
const RDB_VERSION: u16 = 10;
/// A listpack's header: total bytes (u32) and number of elements (u16).
const LP_HEADER: usize = 6;
/// A listpack's last byte.
const LP_END: u8 = 0xFF;

/// `DUMP`'s payload of a hash holding `fields` (field, value pairs, in order). Meant for a few
/// short fields (a listpack counts up to 65,534 entries and holds up to 4 GiB).
#[must_use]
pub fn hash_payload(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut payload = HashPayload::default();
    for (field, value) in fields {
        payload.push(field, value);
    }
    payload.finish()
}

/// A hash's `DUMP` payload built a field at a time (from a scan of the hash, nothing copied
/// but the listpack itself), in the order pushed: [`hash_payload`]'s bytes.
#[derive(Debug, Default)]
pub struct HashPayload {
    lp: Vec<u8>,
    fields: usize,
}

impl HashPayload {
    /// Appends one field and its value.
    pub fn push(&mut self, field: &[u8], value: &[u8]) {
        push_entry(&mut self.lp, field);
        push_entry(&mut self.lp, value);
        self.fields += 1;
    }

    /// The listpack entries' bytes so far (the payload adds at most 30).
    #[must_use]
    pub fn len(&self) -> usize {
        self.lp.len()
    }

    /// Whether no field was pushed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.fields == 0
    }

    /// The payload.
    #[must_use]
    pub fn finish(self) -> Vec<u8> {
        finish(&self.lp, self.fields * 2)
    }
}

/// `DUMP`'s payload of a reentrant lock's hash: `owner` holding `count` (the hot path: the count
/// needs no parsing, and the listpack is written straight into the payload).
#[must_use]
pub fn lock_payload(owner: &[u8], count: u64) -> Vec<u8> {
    let mut lp = Vec::with_capacity(owner.len() + 24);
    push_entry(&mut lp, owner);
    let start = lp.len();
    push_int(&mut lp, i64::try_from(count).unwrap_or(i64::MAX));
    let len = lp.len() - start;
    push_backlen(&mut lp, len);
    finish(&lp, 2)
}

/// The payload around the listpack entries `entries` (`count` of them): listpack header and
/// end, RDB type and length, RDB version, CRC-64.
fn finish(entries: &[u8], count: usize) -> Vec<u8> {
    let lp_len = LP_HEADER + entries.len() + 1;
    let mut payload = Vec::with_capacity(lp_len + 20);
    payload.push(RDB_TYPE_HASH_LISTPACK);
    push_rdb_length(&mut payload, lp_len);
    payload.extend_from_slice(&u32::try_from(lp_len).unwrap_or(u32::MAX).to_le_bytes());
    payload.extend_from_slice(&u16::try_from(count).unwrap_or(u16::MAX).to_le_bytes());
    payload.extend_from_slice(entries);
    payload.push(LP_END);
    payload.extend_from_slice(&RDB_VERSION.to_le_bytes());
    let crc = crc64(&payload);
    payload.extend_from_slice(&crc.to_le_bytes());
    payload
}

/// An RDB length (the listpack is stored as a string of this length).
fn push_rdb_length(out: &mut Vec<u8>, len: usize) {
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.extend_from_slice(&[0x40 | (len >> 8) as u8, len as u8]);
    } else if let Ok(len) = u32::try_from(len) {
        out.push(0x80);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// One listpack entry: its encoding and data, then its length backwards.
fn push_entry(lp: &mut Vec<u8>, bytes: &[u8]) {
    let start = lp.len();
    match canonical_int(bytes) {
        Some(v) => push_int(lp, v),
        None => push_str(lp, bytes),
    }
    push_backlen(lp, lp.len() - start);
}

fn push_int(lp: &mut Vec<u8>, v: i64) {
    if (0..=127).contains(&v) {
        lp.push(v as u8);
    } else if (-4096..=4095).contains(&v) {
        let u = (v as u16) & 0x1FFF;
        lp.extend_from_slice(&[0xC0 | (u >> 8) as u8, u as u8]);
    } else if let Ok(v) = i16::try_from(v) {
        lp.push(0xF1);
        lp.extend_from_slice(&v.to_le_bytes());
    } else if (-(1 << 23)..(1 << 23)).contains(&v) {
        lp.push(0xF2);
        lp.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
    } else if let Ok(v) = i32::try_from(v) {
        lp.push(0xF3);
        lp.extend_from_slice(&v.to_le_bytes());
    } else {
        lp.push(0xF4);
        lp.extend_from_slice(&v.to_le_bytes());
    }
}

fn push_str(lp: &mut Vec<u8>, s: &[u8]) {
    let len = s.len();
    if len < 64 {
        lp.push(0x80 | len as u8);
    } else if len < 4096 {
        lp.extend_from_slice(&[0xE0 | (len >> 8) as u8, len as u8]);
    } else {
        lp.push(0xF0);
        lp.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
    }
    lp.extend_from_slice(s);
}

/// The entry's length, stored after it so a listpack can be walked backwards, as Redis's
/// `lpEncodeBacklen` writes it: 7 bits a byte, most significant first, the high bit set on
/// every byte but the first, in as many bytes as Redis's own thresholds give.
fn push_backlen(lp: &mut Vec<u8>, len: usize) {
    let bytes = match len {
        0..=127 => 1,
        128..=16_382 => 2,
        16_383..=2_097_150 => 3,
        2_097_151..=268_435_454 => 4,
        _ => 5,
    };
    for i in 0..bytes {
        let group = ((len >> (7 * (bytes - 1 - i))) & 127) as u8;
        lp.push(if i == 0 { group } else { group | 128 });
    }
}

/// `bytes` as Redis's `string2ll` reads an integer it would store as one: optional `-`, no
/// leading zero (but `0` itself), no `+`, at most 20 characters, within `i64`.
fn canonical_int(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() || bytes.len() > 20 {
        return None;
    }
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let leading_zero = digits.len() > 1 && digits[0] == b'0';
    if digits.is_empty() || leading_zero || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if bytes == b"-0" {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// CRC-64/Jones as Redis computes it (reflected, polynomial 0xad93d23594c935a9, initial 0).
#[must_use]
pub fn crc64(data: &[u8]) -> u64 {
    data.iter().fold(0, |crc, &b| CRC_TABLE[((crc ^ u64::from(b)) & 0xFF) as usize] ^ (crc >> 8))
}

const CRC_TABLE: [u64; 256] = {
    const POLY: u64 = 0x95AC_9329_AC4B_C9B5; // 0xad93d23594c935a9, bits reversed
    let mut table = [0; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u64;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ POLY } else { crc >> 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};
