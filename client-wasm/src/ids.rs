//! Visitor ids (random UUIDv4) and event ids (UUIDv7), made from bytes the caller supplies.
//!
//! Contract:
//! - [`visitor_id`] turns 16 random bytes into a version-4 UUID; [`event_id`] turns a Unix
//!   time in milliseconds and 10 random bytes into a version-7 UUID whose embedded time is
//!   that instant (the collector checks it lies inside its accepted window).
//! - Both are returned in the canonical lowercase hyphenated form, 36 characters.
//! - Randomness is injected (the browser's `crypto.getRandomValues` in production), so these
//!   functions are pure and tested natively (against the `uuid` crate). Hand-written:
//!   `Uuid::to_string` pulls in `core::fmt` (~18 KB of WebAssembly), and setting the version
//!   and variant bits here costs less than `uuid::Builder`.

/// Lowercase hex digits (also used by `json`).
pub const HEX: &[u8; 16] = b"0123456789abcdef";

/// A random (version 4) UUID: the anonymous visitor id kept in storage.
pub fn visitor_id(random: [u8; 16]) -> String {
    hyphenated(random, 0x40)
}

/// A time-ordered (version 7) UUID for one page view or event, made at `unix_ms`: the
/// time's low 48 bits big-endian, then the random bytes.
pub fn event_id(unix_ms: u64, random: [u8; 10]) -> String {
    let ms = unix_ms.to_be_bytes();
    let r = random;
    hyphenated(
        [
            ms[2], ms[3], ms[4], ms[5], ms[6], ms[7], r[0], r[1], r[2], r[3], r[4], r[5], r[6],
            r[7], r[8], r[9],
        ],
        0x70,
    )
}

/// The canonical 8-4-4-4-12 lowercase form of `b`, stamped with `version` (its high
/// nibble in byte 6) and the RFC 9562 variant (`10` in the high bits of byte 8).
fn hyphenated(mut b: [u8; 16], version: u8) -> String {
    b[6] = b[6] & 0x0f | version;
    b[8] = b[8] & 0x3f | 0x80;
    // Index loops: iterator adapters cost several times more WebAssembly here.
    let mut out = String::new();
    let mut i = 0;
    while i < 16 {
        if i == 4 || i == 6 || i == 8 || i == 10 {
            out.push('-');
        }
        out.push(char::from(HEX[usize::from(b[i] >> 4)]));
        out.push(char::from(HEX[usize::from(b[i] & 15)]));
        i += 1;
    }
    out
}

/// Whether `s` is a canonical hyphenated UUID (any version, either case): the check a stored
/// visitor id must pass before it is reused. Anything else is replaced by a fresh id.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let ok = if matches!(i, 8 | 13 | 18 | 23) {
            c == b'-'
        } else {
            c.is_ascii_hexdigit()
        };
        if !ok {
            return false;
        }
        i += 1;
    }
    i == 36
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::{Builder, Uuid};

    #[test]
    fn visitor_id_is_v4_and_canonical() {
        let id = visitor_id([0xab; 16]);
        assert_eq!(id, "abababab-abab-4bab-abab-abababababab");
        let parsed = Uuid::try_parse(&id).expect("parses");
        assert_eq!(parsed.get_version_num(), 4);
        assert!(is_uuid(&id));
    }

    #[test]
    fn event_id_is_v7_and_carries_the_time() {
        let ms = 1_718_000_000_123u64;
        let id = event_id(ms, [7; 10]);
        let parsed = Uuid::try_parse(&id).expect("parses");
        assert_eq!(parsed.get_version_num(), 7);
        let (secs, nanos) = parsed.get_timestamp().expect("v7 has a time").to_unix();
        assert_eq!(secs * 1000 + u64::from(nanos / 1_000_000), ms);
        assert_eq!(parsed.hyphenated().to_string(), id);
    }

    #[test]
    fn same_bits_as_the_uuid_crate() {
        let random: [u8; 16] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xa5);
        assert_eq!(
            visitor_id(random),
            Builder::from_random_bytes(random).into_uuid().to_string()
        );
        for ms in [0, 1, 1_718_000_000_123, (1 << 48) - 1, u64::MAX] {
            let r: [u8; 10] = std::array::from_fn(|i| random[i + 3]);
            assert_eq!(
                event_id(ms, r),
                Builder::from_unix_timestamp_millis(ms, &r)
                    .into_uuid()
                    .to_string()
            );
        }
    }

    #[test]
    fn different_randomness_gives_different_ids() {
        assert_ne!(event_id(1, [1; 10]), event_id(1, [2; 10]));
        assert_ne!(visitor_id([1; 16]), visitor_id([2; 16]));
    }

    #[test]
    fn is_uuid_rejects_lookalikes() {
        assert!(is_uuid("0190B2A0-0000-7000-8000-000000000000"));
        for bad in [
            "",
            "0190b2a0000070008000000000000000",
            "0190b2a0-0000-7000-8000-00000000000",
            "0190b2a0-0000-7000-8000-0000000000000",
            "0190b2a0+0000-7000-8000-000000000000",
            "0190b2a0-0000-7000-8000-00000000000g",
            "{190b2a0-0000-7000-8000-000000000000",
        ] {
            assert!(!is_uuid(bad), "{bad}");
        }
    }
}
