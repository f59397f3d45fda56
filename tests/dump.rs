//! The `DUMP` payload rlock propagates lock writes with, without a server (the live check that
//! every server restores it is in the integration tests).

use rlock::dump::{crc64, hash_payload, HashPayload};

#[test]
fn crc64_is_redis_jones_crc() {
    // Redis's own check value (src/crc64.c).
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

#[test]
fn a_one_field_lock_hash_is_a_listpack_with_rdb_version_10_and_its_crc() {
    let payload = hash_payload(&[(b"owner-1", b"1")]);
    let lp: Vec<u8> = [
        &[18, 0, 0, 0, 2, 0][..], // 18 bytes, 2 entries
        &[0x87],
        b"owner-1",
        &[8],    // backlen of a 1 + 7 byte entry
        &[1, 1], // the integer 1, backlen 1
        &[0xFF],
    ]
    .concat();
    let mut expected = vec![16, 18];
    expected.extend_from_slice(&lp);
    expected.extend_from_slice(&[10, 0]);
    expected.extend_from_slice(&crc64(&expected).to_le_bytes());
    assert_eq!(payload, expected);
}

#[test]
fn integers_take_redis_encodings_and_other_strings_stay_strings() {
    for (value, encoding) in [
        (&b"0"[..], &[0u8][..]),
        (b"127", &[127]),
        (b"128", &[0xC0, 128]),
        (b"-1", &[0xDF, 0xFF]),
        (b"4095", &[0xCF, 0xFF]),
        (b"4096", &[0xF1, 0x00, 0x10]),
        (b"-32768", &[0xF1, 0x00, 0x80]),
        (b"8388607", &[0xF2, 0xFF, 0xFF, 0x7F]),
        (b"2147483647", &[0xF3, 0xFF, 0xFF, 0xFF, 0x7F]),
        (b"9223372036854775807", &[0xF4, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),
        (b"01", &[0x82, b'0', b'1']),
        (b"-0", &[0x82, b'-', b'0']),
        (b"+1", &[0x82, b'+', b'1']),
        (
            b"9223372036854775808",
            &[
                0x93, b'9', b'2', b'2', b'3', b'3', b'7', b'2', b'0', b'3', b'6', b'8', b'5', b'4',
                b'7', b'7', b'5', b'8', b'0', b'8',
            ],
        ),
    ] {
        let payload = hash_payload(&[(b"f", value)]);
        let lp = &payload[2..payload.len() - 10];
        let entry = &lp[6 + 3..lp.len() - 1];
        assert_eq!(&entry[..entry.len() - 1], encoding, "{:?}", String::from_utf8_lossy(value));
        assert_eq!(usize::from(entry[entry.len() - 1]), encoding.len());
    }
}

#[test]
fn long_strings_get_longer_headers_and_backlens() {
    for len in [63, 64, 126, 127, 4095, 4096, 16_380, 20_000] {
        let owner = vec![b'x'; len];
        let payload = hash_payload(&[(&owner, b"1")]);
        // Type, RDB length of the listpack, then its declared total.
        let (lp_len, header) = match payload[1] >> 6 {
            0 => (usize::from(payload[1]), 2),
            1 => ((usize::from(payload[1] & 0x3F) << 8) | usize::from(payload[2]), 3),
            _ => (u32::from_be_bytes(payload[2..6].try_into().unwrap()) as usize, 6),
        };
        let lp = &payload[header..header + lp_len];
        assert_eq!(u32::from_le_bytes(lp[..4].try_into().unwrap()) as usize, lp_len, "{len}");
        assert_eq!(payload.len(), header + lp_len + 10, "{len}");
        assert_eq!(lp[lp_len - 1], 0xFF);
    }
}

#[test]
fn a_lock_payload_is_the_hash_payload_of_its_owner_and_count() {
    for owner in [&b"owner-1"[..], b"123", b"-7", b"", &[b'x'; 64]] {
        for count in [1_u64, 127, 128, 4095, 4096, 70_000, 1 << 40] {
            let text = count.to_string();
            assert_eq!(
                rlock::dump::lock_payload(owner, count),
                hash_payload(&[(owner, text.as_bytes())]),
                "{owner:?} {count}"
            );
        }
    }
}

#[test]
fn a_payload_built_a_field_at_a_time_is_the_same_in_the_order_pushed() {
    let fields: [(&[u8], &[u8]); 3] = [(b"mode", b"read"), (b"r:1", b"2"), (b"w:1:write", b"1")];
    let mut built = HashPayload::default();
    assert!(built.is_empty());
    for (field, value) in fields {
        built.push(field, value);
    }
    assert!(!built.is_empty() && built.len() > 16);
    assert_eq!(built.finish(), hash_payload(&fields));
    let mut reversed = HashPayload::default();
    for (field, value) in fields.iter().rev() {
        reversed.push(field, value);
    }
    assert_ne!(reversed.finish(), hash_payload(&fields), "the order is kept");
}
