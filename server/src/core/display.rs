//! Page paths made readable for people: `/posts/%E4%B8%AD%E6%96%87` shows as `/posts/中文`.
//!
//! Contract: [`display_path`] percent-decodes a stored page key for display only (keys stay
//! encoded everywhere else). Each maximal run of `%XX` escapes is decoded on its own; a run
//! that is not valid UTF-8, or that decodes to a control character, whitespace other than a
//! plain space, `/`, `%`, `?` or `#` (which would change how the path reads), stays encoded
//! as it was. The result is plain text: the template escapes it.

use percent_encoding::percent_decode_str;

/// The path with its percent-escapes decoded where that is safe to show (see the module doc).
pub fn display_path(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // A run of escapes: `%XX%XX…`.
        let start = i;
        while i + 2 < bytes.len()
            && bytes[i] == b'%'
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
        {
            i += 3;
        }
        if i > start {
            let run = &raw[start..i];
            match percent_decode_str(run).decode_utf8() {
                Ok(text) if text.chars().all(shown) => out.push_str(&text),
                _ => out.push_str(run),
            }
            continue;
        }
        // Anything else is copied up to the next `%`.
        let next = raw[i + 1..].find('%').map_or(raw.len(), |n| i + 1 + n);
        out.push_str(&raw[i..next]);
        i = next;
    }
    out
}

/// Whether a decoded character may replace its escape.
fn shown(c: char) -> bool {
    !(c.is_control() || (c.is_whitespace() && c != ' ') || matches!(c, '/' | '%' | '?' | '#'))
}

#[cfg(test)]
mod tests {
    use super::display_path;

    #[test]
    fn decodes_utf8_runs_and_keeps_the_rest() {
        for (raw, shown) in [
            ("/posts/%E4%B8%AD%E6%96%87", "/posts/中文"),
            ("/a%20b", "/a b"),
            ("/caf%C3%A9/x", "/café/x"),
            ("/bad%FF%FE", "/bad%FF%FE"),
            ("/half%E4%B8", "/half%E4%B8"),
            ("/%E4%B8%AD-%FF-%E6%96%87", "/中-%FF-文"),
            ("/slash%2Fkept", "/slash%2Fkept"),
            ("/nl%0A", "/nl%0A"),
            ("/pct%25", "/pct%25"),
            ("/trailing%", "/trailing%"),
            ("/short%4", "/short%4"),
            ("/%3Cscript%3E", "/<script>"),
            ("", ""),
        ] {
            assert_eq!(display_path(raw), shown, "{raw}");
        }
    }
}
