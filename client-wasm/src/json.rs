//! A deliberately tiny JSON writer: the one JSON the client writes, a hit.
//!
//! Contract:
//! - [`hit`] writes the fields of a `tally_wire::Hit` as compact JSON with the wire type's
//!   serde derive as the one definition of the format: the same field names in the same
//!   order, `null` for an absent `visitor_id` or `referrer`, no `name` or `dedupe` when absent.
//!   Strings are copied as they are (non-ASCII as UTF-8) but for `"`, `\` and the control
//!   characters below U+0020, each written as `\u00XX`: valid JSON that `serde_json` reads
//!   back to the same hit, and otherwise byte for byte what `serde_json::to_string` writes
//!   (the tests hold it to both). Nothing here panics.
//! - The client reads no JSON: the one answer it looks into (the counts for in-page
//!   counters) is handed to the browser's own `JSON.parse` in `js/host.js`.
//!
//! Why by hand: `serde_json` adds ~36 KB to the WebAssembly module, more than four times the
//! whole size budget; a minimal serde `Serializer` of our own still cost 297 B gzip more than
//! this writer over borrowed strings, and the short escapes (`\n`, `\"`, ...) 106 B more than
//! one escape form (see ARCHITECTURE.md, "Size").

use crate::ids::HEX;

/// The fields of one hit, borrowed from wherever the client keeps them: `tally_wire::Hit`
/// without the copies (its field names, its meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HitFields<'a> {
    /// `site`: the site id.
    pub site: &'a str,
    /// `type`: `pageview` or `event`.
    pub kind: &'a str,
    /// `event_id`: the hit's UUIDv7.
    pub event_id: &'a str,
    /// `visitor_id`: the visitor's UUID, `null` when absent.
    pub visitor_id: Option<&'a str>,
    /// `url`: the page's URL.
    pub url: &'a str,
    /// `referrer`: the referring URL, `null` when absent.
    pub referrer: Option<&'a str>,
    /// `name`: an event's name, left out when absent.
    pub name: Option<&'a str>,
    /// `dedupe`: an event's dedupe key, left out when absent.
    pub dedupe: Option<&'a str>,
}

/// Writes a hit as compact JSON, field by field in the order of `tally_wire::Hit`'s serde
/// derive.
pub fn hit(hit: &HitFields) -> String {
    let mut out = String::from("{\"site\":");
    push_str(&mut out, hit.site);
    out.push_str(",\"type\":");
    push_str(&mut out, hit.kind);
    out.push_str(",\"event_id\":");
    push_str(&mut out, hit.event_id);
    out.push_str(",\"visitor_id\":");
    push_opt(&mut out, hit.visitor_id);
    out.push_str(",\"url\":");
    push_str(&mut out, hit.url);
    out.push_str(",\"referrer\":");
    push_opt(&mut out, hit.referrer);
    if let Some(name) = hit.name {
        out.push_str(",\"name\":");
        push_str(&mut out, name);
    }
    if let Some(dedupe) = hit.dedupe {
        out.push_str(",\"dedupe\":");
        push_str(&mut out, dedupe);
    }
    out.push('}');
    out
}

/// Appends `s` as a JSON string literal, or `null`.
fn push_opt(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => push_str(out, s),
        None => out.push_str("null"),
    }
}

/// Appends the decimal form of `n` (no `format!`: it would pull in `core::fmt`'s integer code).
pub fn push_u64(out: &mut String, mut n: u64) {
    // Index loops: iterator adapters cost several times more WebAssembly here.
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while i < buf.len() {
        out.push(char::from(buf[i]));
        i += 1;
    }
}

/// Appends `s` as a JSON string literal, quotes included: `"`, `\` and the control
/// characters as `\u00XX`, everything else as it is.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    // Byte by byte: only ASCII bytes are ever escaped, so every cut below is at a char
    // boundary and the runs in between (UTF-8 included) are copied as they are.
    let b = s.as_bytes();
    let (mut run, mut i) = (0, 0);
    while i < b.len() {
        let c = b[i];
        if c < 32 || c == b'"' || c == b'\\' {
            out.push_str(&s[run..i]);
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(c >> 4)]));
            out.push(char::from(HEX[usize::from(c & 15)]));
            run = i + 1;
        }
        i += 1;
    }
    out.push_str(&s[run..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use tally_wire::Hit;

    /// The borrowed fields of a wire hit (naming every field: a new one fails to compile here).
    fn fields(h: &Hit) -> HitFields<'_> {
        let Hit {
            site,
            kind,
            event_id,
            visitor_id,
            url,
            referrer,
            name,
            dedupe,
            screen_width: _,
            engaged_ms: _,
            scroll: _,
        } = h;
        HitFields {
            site,
            kind,
            event_id,
            visitor_id: visitor_id.as_deref(),
            url,
            referrer: referrer.as_deref(),
            name: name.as_deref(),
            dedupe: dedupe.as_deref(),
        }
    }

    fn page_view() -> Hit {
        Hit {
            site: "blog".into(),
            kind: "pageview".into(),
            event_id: "0190b2a0-0000-7000-8000-000000000000".into(),
            visitor_id: None,
            url: "https://a.example/p?q=\"x\"\n\u{1f}\\\u{7f}".into(),
            referrer: Some("https://b.example/é😀".into()),
            name: None,
            dedupe: None,
            screen_width: None,
            engaged_ms: None,
            scroll: None,
        }
    }

    #[test]
    fn hit_is_written_as_the_wire_format_says() {
        assert_eq!(
            hit(&fields(&page_view())),
            "{\"site\":\"blog\",\"type\":\"pageview\",\"event_id\":\"0190b2a0-0000-7000-8000-000000000000\",\"visitor_id\":null,\"url\":\"https://a.example/p?q=\\u0022x\\u0022\\u000a\\u001f\\u005c\u{7f}\",\"referrer\":\"https://b.example/é😀\"}"
        );
    }

    #[test]
    fn output_is_what_serde_json_writes_and_reads_for_every_hit_shape() {
        // Without characters to escape, byte for byte serde_json's output; with them, JSON that
        // serde_json reads back to the same hit.
        let plain = ["", "v", "é😀\u{7f}/<>'&%20"];
        let escaped = ["sign\u{1}up\\\t\r\u{8}\u{c}\"é😀\u{7f}", "\"\"\\\n"];
        for bits in 0..16 {
            for text in plain.into_iter().chain(escaped) {
                let some = |bit: u32| (bits & bit != 0).then(|| text.to_owned());
                let h = Hit {
                    kind: if bits & 4 != 0 { "event" } else { "pageview" }.into(),
                    visitor_id: some(1),
                    referrer: some(2),
                    name: some(4),
                    dedupe: some(8),
                    url: format!("https://a.example/{text}"),
                    ..page_view()
                };
                let ours = hit(&fields(&h));
                if plain.contains(&text) {
                    assert_eq!(ours, serde_json::to_string(&h).expect("serde_json"));
                }
                assert_eq!(serde_json::from_str::<Hit>(&ours).expect("reads back"), h);
            }
        }
    }

    #[test]
    fn escapes_quote_backslash_and_control_characters_only() {
        for c in (0..=0x7f_u8).map(char::from).chain(['é', '😀', '\u{2028}']) {
            let mut out = String::new();
            push_str(&mut out, &c.to_string());
            if c < ' ' || c == '"' || c == '\\' {
                assert_eq!(out, format!("\"\\u{:04x}\"", c as u32));
            } else {
                assert_eq!(out, format!("\"{c}\""));
            }
            let back: String = serde_json::from_str(&out).expect("valid JSON");
            assert_eq!(back, c.to_string());
        }
    }

    #[test]
    fn decimal_formatting() {
        let mut s = String::new();
        push_u64(&mut s, 0);
        s.push(' ');
        push_u64(&mut s, 1_234_567_890);
        s.push(' ');
        push_u64(&mut s, u64::MAX);
        assert_eq!(s, "0 1234567890 18446744073709551615");
    }
}
