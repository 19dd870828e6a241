//! The bounded outbox of hits not yet confirmed by the collector, and its storage encoding.
//!
//! Contract:
//! - Every hit enters the queue *before* it is first sent and leaves it only when the
//!   collector has answered it (2xx, or a 4xx that retrying cannot fix). A hit whose page
//!   closed mid-flight is therefore sent again on the next page load; the collector dedupes
//!   it by its event id, which never changes.
//! - Bounded: at most [`MAX_ENTRIES`] entries (the oldest are dropped first), and an entry
//!   older than [`MAX_AGE_MS`] is dropped because the collector would refuse its event id.
//! - [`encode`]/[`decode`] give a plain-text form for `localStorage`: one entry per line,
//!   `due attempts born event_id body`. The body is compact JSON (it never holds a raw
//!   newline), so it is stored and resent byte for byte. Malformed lines are skipped, never
//!   fatal: storage is shared with other scripts and other tabs.

use crate::json::push_u64;

/// Most entries kept; older ones are dropped first.
pub const MAX_ENTRIES: usize = 20;
/// Oldest entry kept: just under the collector's default 72 h event-id window.
pub const MAX_AGE_MS: u64 = 71 * 60 * 60 * 1_000;

/// One hit waiting for a confirmed delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Earliest time (Unix ms) the next try may start.
    pub due: u64,
    /// Failed (or unconfirmed) tries so far; drives the backoff.
    pub attempts: u32,
    /// When the hit was made (Unix ms); drives expiry.
    pub born: u64,
    /// The hit's event id: the queue's key, and the collector's dedupe key.
    pub id: String,
    /// The exact JSON body to send.
    pub body: String,
}

/// Reads the stored form, skipping lines that do not parse.
pub fn decode(text: &str) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (line, tail) = cut(rest, b'\n');
        rest = tail;
        if let Some(e) = decode_line(line) {
            entries.push(e);
        }
    }
    entries
}

fn decode_line(line: &str) -> Option<Entry> {
    let (due, rest) = cut(line, b' ');
    let (attempts, rest) = cut(rest, b' ');
    let (born, rest) = cut(rest, b' ');
    let (id, body) = cut(rest, b' ');
    if id.is_empty() || !body.starts_with('{') {
        return None;
    }
    Some(Entry {
        due: number(due)?,
        attempts: u32::try_from(number(attempts)?).ok()?,
        born: number(born)?,
        id: id.to_owned(),
        body: body.to_owned(),
    })
}

/// Splits at the first `sep` (an ASCII byte, so the cut is on a char boundary); the whole
/// string and `""` when there is none.
fn cut(s: &str, sep: u8) -> (&str, &str) {
    match s.bytes().position(|b| b == sep) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    }
}

/// A decimal number of 1 to 19 digits (`str::parse` costs more WebAssembly than this).
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.bytes().try_fold(0u64, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

/// Writes the stored form.
pub fn encode(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        if !out.is_empty() {
            out.push('\n');
        }
        push_u64(&mut out, e.due);
        out.push(' ');
        push_u64(&mut out, u64::from(e.attempts));
        out.push(' ');
        push_u64(&mut out, e.born);
        out.push(' ');
        out.push_str(&e.id);
        out.push(' ');
        out.push_str(&e.body);
    }
    out
}

/// Removes the entry with this event id, if any.
pub fn remove(entries: &mut Vec<Entry>, id: &str) {
    entries.retain(|e| e.id != id);
}

/// Adds `entry`, replacing one with the same id, then enforces the bounds.
pub fn push(entries: &mut Vec<Entry>, entry: Entry, now_ms: u64) {
    remove(entries, &entry.id);
    entries.push(entry);
    prune(entries, now_ms);
}

/// Drops expired entries and, beyond [`MAX_ENTRIES`], the oldest ones.
pub fn prune(entries: &mut Vec<Entry>, now_ms: u64) {
    entries.retain(|e| now_ms.saturating_sub(e.born) < MAX_AGE_MS);
    while entries.len() > MAX_ENTRIES {
        let mut oldest = 0;
        for (i, e) in entries.iter().enumerate() {
            if e.born < entries[oldest].born {
                oldest = i;
            }
        }
        entries.remove(oldest);
    }
}

/// Earliest `due` among entries that `busy` does not exclude.
pub fn next_due(entries: &[Entry], busy: impl Fn(&str) -> bool) -> Option<u64> {
    entries.iter().filter(|e| !busy(&e.id)).map(|e| e.due).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, born: u64) -> Entry {
        Entry {
            due: born + 5,
            attempts: 1,
            born,
            id: id.into(),
            body: format!("{{\"e\":\"{id} x\"}}"),
        }
    }

    #[test]
    fn round_trips_through_text() {
        let entries = vec![entry("a", 1), entry("b", 2)];
        let text = encode(&entries);
        assert_eq!(text, "6 1 1 a {\"e\":\"a x\"}\n7 1 2 b {\"e\":\"b x\"}");
        assert_eq!(decode(&text), entries);
        assert_eq!(decode(""), vec![]);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let text = "garbage\n6 1 1 a {\"e\":1}\n1 2 3\nx 1 1 b {}\n1 1 1  {}\n1 1 1 c notjson\n\
                    99999999999999999999 1 1 d {}\n1 99999999999 1 e {}\n\n";
        assert_eq!(decode(text).len(), 1);
    }

    #[test]
    fn push_replaces_same_id() {
        let mut q = vec![entry("a", 1)];
        let mut again = entry("a", 1);
        again.attempts = 3;
        push(&mut q, again.clone(), 10);
        assert_eq!(q, vec![again]);
    }

    #[test]
    fn bounded_by_count_dropping_oldest() {
        let mut q = Vec::new();
        for i in 0..(MAX_ENTRIES as u64 + 5) {
            push(&mut q, entry(&i.to_string(), 100 - i), 100);
        }
        assert_eq!(q.len(), MAX_ENTRIES);
        // born = 100 - i: the five with the largest i were the oldest.
        assert!(q.iter().all(|e| e.born > 100 - MAX_ENTRIES as u64));
    }

    #[test]
    fn expired_entries_are_dropped() {
        let mut q = vec![entry("old", 0), entry("new", MAX_AGE_MS)];
        prune(&mut q, MAX_AGE_MS);
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].id, "new");
    }

    #[test]
    fn next_due_skips_busy_entries() {
        let q = vec![entry("a", 1), entry("b", 50)];
        assert_eq!(next_due(&q, |_| false), Some(6));
        assert_eq!(next_due(&q, |id| id == "a"), Some(55));
        assert_eq!(next_due(&q, |_| true), None);
    }
}
