//! The bounded outbox of hits not yet confirmed by the collector, kept and edited as its
//! stored text.
//!
//! Contract:
//! - Every hit enters the queue *before* it is first sent and leaves it only when the
//!   collector has answered it (2xx, or a 4xx that retrying cannot fix). A hit whose page
//!   closed mid-flight is therefore sent again on the next page load; the collector dedupes
//!   it by its event id, which never changes.
//! - Bounded: at most [`MAX_ENTRIES`] entries (beyond that the first queued, i.e. oldest, are
//!   dropped), and an entry older than [`MAX_AGE_MS`] is dropped because the collector would
//!   refuse its event id.
//! - The stored form (`localStorage`) is plain text, one entry per line:
//!   `due attempts born event_id body`. The body is compact JSON (it never holds a raw
//!   newline), so it is stored and resent byte for byte. New entries are appended ([`line`]),
//!   so line order is queueing order. Malformed lines are skipped, never fatal: storage is
//!   shared with other scripts and other tabs. Several entries may share an event id (a page
//!   view and its engagement reports); the client sends them one at a time, in line order.
//! - The queue is never decoded into owned entries: [`edit`] rewrites the text in one pass,
//!   offering each entry's [`Head`] (the mutable numbers) with its id and body as slices of
//!   the stored text. That one pass is how the client sends, settles, retries and beacons.

use crate::json::push_u64;

/// Most entries kept; the first queued are dropped first.
pub const MAX_ENTRIES: usize = 20;
/// Oldest entry kept: just under the collector's default 72 h event-id window.
pub const MAX_AGE_MS: u64 = 71 * 60 * 60 * 1_000;

/// The numbers of one queued hit, the part of an entry that changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Earliest time (Unix ms) the next try may start.
    pub due: u64,
    /// Failed (or unconfirmed) tries so far; drives the backoff.
    pub attempts: u32,
    /// When the hit was made (Unix ms); drives expiry.
    pub born: u64,
}

/// One queued hit, owned: for inspecting a queue in tests ([`decode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its numbers.
    pub head: Head,
    /// The hit's event id: the queue's key (shared by a page view and its engagement
    /// reports), and the collector's dedupe key.
    pub id: String,
    /// The exact JSON body to send.
    pub body: String,
}

/// Appends one entry's line to `out`.
pub fn line(out: &mut String, h: Head, id: &str, body: &str) {
    push_u64(out, h.due);
    out.push(' ');
    push_u64(out, u64::from(h.attempts));
    out.push(' ');
    push_u64(out, h.born);
    out.push(' ');
    out.push_str(id);
    out.push(' ');
    out.push_str(body);
    out.push('\n');
}

/// Rewrites the stored queue: drops malformed and expired lines, offers each entry to `f`
/// (which may change its [`Head`], or drop it by returning false), and keeps at most
/// [`MAX_ENTRIES`], the last queued.
pub fn edit(text: &str, now_ms: u64, mut f: impl FnMut(&mut Head, &str, &str) -> bool) -> String {
    let mut out = String::new();
    let mut lines = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let l;
        (l, rest) = cut(rest, b'\n');
        if let Some((mut h, id, body)) = parse(l)
            && now_ms.saturating_sub(h.born) < MAX_AGE_MS
            && f(&mut h, id, body)
        {
            line(&mut out, h, id, body);
            lines += 1;
        }
    }
    // Drop the first queued beyond the bound.
    let mut kept = out.as_str();
    while lines > MAX_ENTRIES {
        kept = cut(kept, b'\n').1;
        lines -= 1;
    }
    kept.into()
}

/// Reads the stored form into owned entries, as [`edit`] would keep them (at most
/// [`MAX_ENTRIES`]): for tests and diagnostics; the client itself uses [`edit`].
pub fn decode(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    edit(text, 0, |&mut head, id, body| {
        entries.push(Entry {
            head,
            id: id.into(),
            body: body.into(),
        });
        true
    });
    entries
}

/// One line: `due attempts born id {body`, else `None`.
fn parse(l: &str) -> Option<(Head, &str, &str)> {
    let (due, l) = cut(l, b' ');
    let (attempts, l) = cut(l, b' ');
    let (born, l) = cut(l, b' ');
    let (id, body) = cut(l, b' ');
    if id.is_empty() || !body.starts_with('{') {
        return None;
    }
    let head = Head {
        due: number(due)?,
        attempts: u32::try_from(number(attempts)?).ok()?,
        born: number(born)?,
    };
    Some((head, id, body))
}

/// Splits at the first `sep` (an ASCII byte, so the cut is on a char boundary); the whole
/// string and `""` when there is none.
pub fn cut(s: &str, sep: u8) -> (&str, &str) {
    // Index loops: iterator adapters cost several times more WebAssembly here.
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && b[i] != sep {
        i += 1;
    }
    (&s[..i], s.get(i + 1..).unwrap_or_default())
}

/// A decimal number of 1 to 19 digits (`str::parse` costs more WebAssembly than this).
fn number(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    let mut n = 0;
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(b[i] - b'0');
        i += 1;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(born: u64) -> Head {
        Head {
            due: born + 5,
            attempts: 1,
            born,
        }
    }

    fn text(entries: &[(&str, u64)]) -> String {
        let mut out = String::new();
        for &(id, born) in entries {
            line(&mut out, head(born), id, &format!("{{\"e\":\"{id} x\"}}"));
        }
        out
    }

    #[test]
    fn round_trips_through_text() {
        let t = text(&[("a", 1), ("b", 2)]);
        assert_eq!(t, "6 1 1 a {\"e\":\"a x\"}\n7 1 2 b {\"e\":\"b x\"}\n");
        let q = decode(&t);
        assert_eq!(q.len(), 2);
        assert_eq!(q[1].head, head(2));
        assert_eq!(
            (q[1].id.as_str(), q[1].body.as_str()),
            ("b", "{\"e\":\"b x\"}")
        );
        assert_eq!(
            edit(&t, 2, |_, _, _| true),
            t,
            "an edit that changes nothing"
        );
        assert_eq!(decode(""), vec![]);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let text = "garbage\n6 1 1 a {\"e\":1}\n1 2 3\nx 1 1 b {}\n1 1 1  {}\n1 1 1 c notjson\n\
                    99999999999999999999 1 1 d {}\n1 99999999999 1 e {}\n\n";
        assert_eq!(decode(text).len(), 1);
        assert_eq!(edit(text, 1, |_, _, _| true), "6 1 1 a {\"e\":1}\n");
    }

    #[test]
    fn edit_changes_heads_and_drops_entries() {
        let t = text(&[("a", 1), ("b", 2), ("c", 3)]);
        let t = edit(&t, 3, |h, id, _| {
            h.attempts += u32::from(id == "a");
            id != "b"
        });
        let q = decode(&t);
        assert_eq!(q.len(), 2);
        assert_eq!((q[0].id.as_str(), q[0].head.attempts), ("a", 2));
        assert_eq!((q[1].id.as_str(), q[1].head.attempts), ("c", 1));
    }

    #[test]
    fn bounded_by_count_dropping_the_first_queued() {
        let mut t = String::new();
        for i in 0..(MAX_ENTRIES as u64 + 5) {
            line(&mut t, head(i), &i.to_string(), "{}");
            t = edit(&t, 100, |_, _, _| true);
        }
        let q = decode(&t);
        assert_eq!(q.len(), MAX_ENTRIES);
        // Queued in the order of i: the first five are gone.
        assert!(q.iter().all(|e| e.head.born >= 5));
    }

    #[test]
    fn expired_entries_are_dropped() {
        let t = text(&[("old", 0), ("new", MAX_AGE_MS)]);
        let q = decode(&edit(&t, MAX_AGE_MS, |_, _, _| true));
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].id, "new");
    }
}
