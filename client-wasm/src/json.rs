//! A deliberately tiny JSON writer: the one JSON the client writes, a hit.
//!
//! Contract:
//! - [`hit`] writes the fields of a `tally_wire::Hit` as compact JSON with the wire type's
//!   serde derive as the one definition of the format: the same field names in the same
//!   order, `null` for an absent `visitor_id` or `referrer`, no `name`, `dedupe` or
//!   `screen_width` when absent. An engagement report is [`open`] (the hit without its
//!   closing brace, written once per page view) completed by [`engagement`] with its two
//!   numbers, `engaged_ms` and `scroll`, each time it is made.
//! - The free-form strings (`site`, `url`, `referrer`, `name`, `dedupe`) are quoted by the
//!   caller's `quote`: in the browser `JSON.stringify` (through `js/host.js`), whose escapes
//!   are exactly serde_json's (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, else `\u00xx` below
//!   U+0020; nothing else escaped), so the output is byte for byte what
//!   `serde_json::to_string` writes for the same hit (the tests hold it to that with
//!   serde_json as `quote`). `type` and the ids are written as they are: a constant, and
//!   UUIDs the client made or checked (`ids`). Nothing here panics.
//! - The client reads no JSON: the one answer it looks into (the counts for in-page
//!   counters) is handed to the browser's own `JSON.parse` in `js/host.js`.
//!
//! Why by hand: `serde_json` adds ~36 KB to the WebAssembly module, more than four times the
//! whole size budget; a minimal serde `Serializer` of our own still cost 297 B gzip more than
//! this writer over borrowed strings, and escaping here rather than in the browser 28 B more
//! (see ARCHITECTURE.md, "Size").

/// The fields of one hit, borrowed from wherever the client keeps them: `tally_wire::Hit`
/// without the copies (its field names, its meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HitFields<'a> {
    /// `site`: the site id.
    pub site: &'a str,
    /// `type`: `pageview`, `event` or `engagement`.
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
    /// `screen_width`: a page view's screen width in CSS pixels, left out when absent.
    pub screen_width: Option<u32>,
}

/// Writes a hit as compact JSON, field by field in the order of `tally_wire::Hit`'s serde
/// derive.
pub fn hit(hit: &HitFields, quote: &impl Fn(&str) -> String) -> String {
    let mut out = open(hit, quote);
    out.push('}');
    out
}

/// Completes an engagement report begun by [`open`]: its `engaged_ms` and `scroll`, the
/// last two fields of `tally_wire::Hit`, and the closing brace.
pub fn engagement(open: &str, engaged_ms: u64, scroll: u8) -> String {
    let mut out = String::from(open);
    out.push_str(",\"engaged_ms\":");
    push_u64(&mut out, engaged_ms);
    out.push_str(",\"scroll\":");
    push_u64(&mut out, u64::from(scroll));
    out.push('}');
    out
}

/// [`hit`] without its closing brace, for fields that follow (an engagement report's).
pub fn open(hit: &HitFields, quote: &impl Fn(&str) -> String) -> String {
    let mut out = String::from("{\"site\":");
    out.push_str(&quote(hit.site));
    out.push_str(",\"type\":\"");
    out.push_str(hit.kind);
    out.push_str("\",\"event_id\":\"");
    out.push_str(hit.event_id);
    out.push_str("\",\"visitor_id\":");
    match hit.visitor_id {
        Some(id) => {
            out.push('"');
            out.push_str(id);
            out.push('"');
        }
        None => out.push_str("null"),
    }
    out.push_str(",\"url\":");
    out.push_str(&quote(hit.url));
    out.push_str(",\"referrer\":");
    match hit.referrer {
        Some(r) => out.push_str(&quote(r)),
        None => out.push_str("null"),
    }
    if let Some(name) = hit.name {
        out.push_str(",\"name\":");
        out.push_str(&quote(name));
    }
    if let Some(dedupe) = hit.dedupe {
        out.push_str(",\"dedupe\":");
        out.push_str(&quote(dedupe));
    }
    if let Some(width) = hit.screen_width {
        out.push_str(",\"screen_width\":");
        push_u64(&mut out, u64::from(width));
    }
    out
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
            screen_width,
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
            screen_width: *screen_width,
        }
    }

    /// The browser's `JSON.stringify` of a string, as serde_json writes it.
    fn quote(s: &str) -> String {
        serde_json::to_string(s).expect("a string serialises")
    }

    /// What the client sends for a wire hit: an engagement report is opened and completed.
    fn written(h: &Hit) -> String {
        match (h.engaged_ms, h.scroll) {
            (Some(ms), Some(scroll)) => engagement(&open(&fields(h), &quote), ms, scroll),
            _ => hit(&fields(h), &quote),
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
            hit(&fields(&page_view()), &quote),
            "{\"site\":\"blog\",\"type\":\"pageview\",\"event_id\":\"0190b2a0-0000-7000-8000-000000000000\",\"visitor_id\":null,\"url\":\"https://a.example/p?q=\\\"x\\\"\\n\\u001f\\\\\u{7f}\",\"referrer\":\"https://b.example/é😀\"}"
        );
    }

    #[test]
    fn only_the_free_form_strings_go_through_quote() {
        let quoted = std::cell::RefCell::new(Vec::new());
        let h = Hit {
            visitor_id: Some("3f0c9a52-8f5e-4b4a-9d61-0c2a7d1e5b8f".into()),
            name: Some("n".into()),
            dedupe: Some("d".into()),
            ..page_view()
        };
        let spy = |s: &str| {
            quoted.borrow_mut().push(s.to_owned());
            quote(s)
        };
        hit(&fields(&h), &spy);
        assert_eq!(
            quoted.into_inner(),
            ["blog", &h.url, "https://b.example/é😀", "n", "d"].map(String::from)
        );
    }

    #[test]
    fn output_is_what_serde_json_writes_and_reads_for_every_hit_shape() {
        // Byte for byte serde_json's output, escapes included, and it reads back to the hit.
        let plain = ["", "v", "é😀\u{7f}/<>'&%20"];
        let escaped = ["sign\u{1}up\\\t\r\u{8}\u{c}\"é😀\u{7f}", "\"\"\\\n"];
        for bits in 0..64 {
            for text in plain.into_iter().chain(escaped) {
                let some = |bit: u32| (bits & bit != 0).then(|| text.to_owned());
                let visitor = "3f0c9a52-8f5e-4b4a-9d61-0c2a7d1e5b8f";
                let engaged = bits & 32 != 0;
                let h = Hit {
                    kind: if engaged {
                        "engagement"
                    } else if bits & 4 != 0 {
                        "event"
                    } else {
                        "pageview"
                    }
                    .into(),
                    visitor_id: (bits & 1 != 0).then(|| visitor.to_owned()),
                    referrer: some(2),
                    name: some(4),
                    dedupe: some(8),
                    screen_width: (bits & 16 != 0).then_some(1_440),
                    engaged_ms: engaged.then_some(tally_wire::MAX_ENGAGED_MS),
                    scroll: engaged.then_some(100),
                    url: format!("https://a.example/{text}"),
                    ..page_view()
                };
                let ours = written(&h);
                assert_eq!(ours, serde_json::to_string(&h).expect("serde_json"));
                assert_eq!(serde_json::from_str::<Hit>(&ours).expect("reads back"), h);
            }
        }
    }

    #[test]
    fn page_views_carry_the_screen_width_and_reports_their_numbers_last() {
        let view = Hit {
            screen_width: Some(390),
            ..page_view()
        };
        assert!(hit(&fields(&view), &quote).ends_with(",\"screen_width\":390}"));
        let report = Hit {
            kind: tally_wire::TYPE_ENGAGEMENT.into(),
            referrer: None,
            engaged_ms: Some(12_345),
            scroll: Some(0),
            ..page_view()
        };
        let body = written(&report);
        assert!(body.ends_with(",\"referrer\":null,\"engaged_ms\":12345,\"scroll\":0}"));
        assert_eq!(
            serde_json::from_str::<Hit>(&body).expect("reads back"),
            report
        );
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
