//! Access-log lines → [`Parsed`] page views: nginx/Apache combined and Caddy JSON.
//!
//! Contract: a line is a page view when its method is GET and its status is 2xx or 304;
//! anything else is an `Err` with the reason (the caller writes it to the reject file).
//! Paths keep their query here (the page key drops it later).

use jiff::Timestamp;

use super::Parsed;

/// The status and method rule shared by both formats.
fn page_view(method: &str, status: u16) -> Result<(), String> {
    if method != "GET" {
        return Err(format!("not a page view: method {method}"));
    }
    if !((200..300).contains(&status) || status == 304) {
        return Err(format!("not a page view: status {status}"));
    }
    Ok(())
}

/// Next field of a combined line: a `"quoted"` string (with `\"` escapes) or a bare token.
fn field(rest: &mut &str) -> Option<String> {
    let s = rest.trim_start();
    if let Some(body) = s.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, next)) = chars.next() {
                        out.push(next);
                    }
                }
                '"' => {
                    *rest = &body[i + 1..];
                    return Some(out);
                }
                c => out.push(c),
            }
        }
        None
    } else if s.is_empty() {
        None
    } else {
        let end = s.find(char::is_whitespace).unwrap_or(s.len());
        *rest = &s[end..];
        Some(s[..end].to_owned())
    }
}

/// `[vhost:port] ip ident user [10/Oct/2000:13:55:36 -0700] "GET /a HTTP/1.1" 200 2326 "ref" "ua"`
pub(super) fn combined(line: &str) -> Result<Parsed, String> {
    let line = line.trim_end_matches(['\r', '\n']);
    let open = line.find('[').ok_or("malformed: no [time]")?;
    let close = open + line[open..].find(']').ok_or("malformed: no [time]")?;
    let head: Vec<&str> = line[..open].split_whitespace().collect();
    let (host, client) = match head.as_slice() {
        [ip, _, _] => (None, *ip),
        [vhost, ip, _, _] => (Some((*vhost).to_owned()), *ip),
        _ => return Err("malformed: expected `ip ident user [time]`".into()),
    };
    let at = Timestamp::strptime("%d/%b/%Y:%H:%M:%S %z", &line[open + 1..close])
        .map_err(|e| format!("malformed time: {e}"))?;
    let mut rest = &line[close + 1..];
    let request = field(&mut rest).ok_or("malformed: no request")?;
    let status: u16 = field(&mut rest)
        .and_then(|s| s.parse().ok())
        .ok_or("malformed: no status")?;
    let _bytes = field(&mut rest);
    let referrer = field(&mut rest).ok_or("malformed: no referrer field (not combined)")?;
    let user_agent = field(&mut rest).ok_or("malformed: no user agent field (not combined)")?;
    let mut parts = request.split(' ');
    let method = parts.next().unwrap_or("");
    let path = parts.next().ok_or("malformed: request without a path")?;
    page_view(method, status)?;
    Ok(Parsed {
        at,
        path: path.to_owned(),
        referrer: Some(referrer),
        user_agent,
        client: client.to_owned(),
        host,
        event: false,
        campaign: None,
        stated: None,
    })
}

/// One line of Caddy's JSON access log (`"logger":"http.log.access..."`).
pub(super) fn caddy(line: &str) -> Result<Parsed, String> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("malformed JSON: {e}"))?;
    let req = v.get("request").ok_or("malformed: no request object")?;
    let text =
        |o: &serde_json::Value, k: &str| o.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let header = |name: &str| {
        req.get("headers")
            .and_then(|h| h.get(name))
            .and_then(|x| x.get(0))
            .and_then(|x| x.as_str())
            .map(str::to_owned)
    };
    let at = match v.get("ts") {
        Some(serde_json::Value::Number(n)) => {
            let secs = n.as_f64().ok_or("malformed ts")?;
            Timestamp::from_millisecond((secs * 1000.0) as i64).map_err(|e| e.to_string())?
        }
        Some(serde_json::Value::String(s)) => s
            .parse::<Timestamp>()
            .map_err(|e| format!("malformed ts: {e}"))?,
        _ => return Err("malformed: no ts".into()),
    };
    let status = v
        .get("status")
        .and_then(|s| s.as_u64())
        .and_then(|s| u16::try_from(s).ok())
        .ok_or("malformed: no status")?;
    let method = text(req, "method").ok_or("malformed: no request.method")?;
    let path = text(req, "uri").ok_or("malformed: no request.uri")?;
    page_view(&method, status)?;
    Ok(Parsed {
        at,
        path,
        referrer: header("Referer"),
        user_agent: header("User-Agent").unwrap_or_default(),
        client: text(req, "client_ip")
            .or_else(|| text(req, "remote_ip"))
            .unwrap_or_default(),
        host: text(req, "host"),
        event: false,
        campaign: None,
        stated: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_lines_parse_and_filter() {
        let p = combined(
            r#"203.0.113.9 - - [10/Oct/2025:13:55:36 -0700] "GET /posts/a?x=1 HTTP/1.1" 200 2326 "https://news.example.net/" "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0""#,
        )
        .expect("parses");
        assert_eq!(p.path, "/posts/a?x=1");
        assert_eq!(p.at.to_string(), "2025-10-10T20:55:36Z");
        assert_eq!(p.client, "203.0.113.9");
        let post = combined(
            r#"1.2.3.4 - - [10/Oct/2025:13:55:36 +0000] "POST /a HTTP/1.1" 200 1 "-" "x""#,
        );
        assert_eq!(post.err().as_deref(), Some("not a page view: method POST"));
        let vhost = combined(r#"blog.example.com:443 1.2.3.4 - - [10/Oct/2025:13:55:36 +0000] "GET /a HTTP/1.1" 304 0 "-" "ua \"q\"""#)
            .expect("vhost");
        assert_eq!(vhost.host.as_deref(), Some("blog.example.com:443"));
        assert_eq!(vhost.user_agent, "ua \"q\"");
    }
}
