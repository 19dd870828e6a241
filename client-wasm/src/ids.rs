//! Visitor ids (random UUIDv4) and event ids (UUIDv7), made from bytes the caller supplies.
//!
//! Contract:
//! - [`visitor_id`] turns 16 random bytes into a version-4 UUID; [`event_id`] turns a Unix
//!   time in milliseconds and 10 random bytes into a version-7 UUID whose embedded time is
//!   that instant (the collector checks it lies inside its accepted window).
//! - Both are returned in the canonical lowercase hyphenated form, 36 characters.
//! - Randomness is injected (the browser's `crypto.getRandomValues` in production), so these
//!   functions are pure and tested natively. Formatting is hand-written: `Uuid::to_string`
//!   pulls in `core::fmt` (~18 KB of WebAssembly).

use uuid::{Builder, Uuid};

/// A random (version 4) UUID: the anonymous visitor id kept in storage.
pub fn visitor_id(random: [u8; 16]) -> String {
    hyphenated(&Builder::from_random_bytes(random).into_uuid())
}

/// A time-ordered (version 7) UUID for one page view or event, made at `unix_ms`.
pub fn event_id(unix_ms: u64, random: [u8; 10]) -> String {
    hyphenated(&Builder::from_unix_timestamp_millis(unix_ms, &random).into_uuid())
}

/// The canonical 8-4-4-4-12 lowercase form.
pub fn hyphenated(uuid: &Uuid) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Index loops: iterator adapters cost several times more WebAssembly here.
    let b = uuid.as_bytes();
    let mut out = String::with_capacity(36);
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
    if b.len() != 36 {
        return false;
    }
    let mut i = 0;
    while i < 36 {
        let dash = i == 8 || i == 13 || i == 18 || i == 23;
        if dash != (b[i] == b'-') || !dash && !b[i].is_ascii_hexdigit() {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(hyphenated(&parsed), id);
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
