//! The bot filter: user agents that are not people.
//!
//! Contract:
//! - The list is data: `server/data/bots/isbot-patterns.json`, the pattern list of the npm
//!   package `isbot` (Unlicense), refreshed by `scripts/refresh-bot-list.sh`; its version and
//!   source are in `server/data/bots/SOURCES.md`. It is compiled into the binary.
//! - A user agent is a bot when any pattern matches it, case-insensitively, with JavaScript's
//!   ASCII meaning of `\w`, `\d`, `\s` and `\b` (the list is written for JavaScript). Patterns
//!   without look-around (all but a handful) form alternations of [`CHUNK`] patterns each, run
//!   by the `regex` crate (a lazy DFA, linear time); the few with look-behind or look-ahead, which `regex` lacks, are
//!   run by `fancy-regex`, only when the alternation did not already match and only those whose
//!   pattern without its look-around (a `regex::bytes::RegexSet`, a superset) matches.
//! - The corpus test (`tests/it/bots.rs`) holds the list to: at most 1 % of the crawler corpus
//!   counted, no real browser filtered.
//! - Judging is pure and never panics; a pattern that does not compile is skipped (and a unit
//!   test fails, so a refresh cannot ship one silently).
//! - [`BotFilter`] is what every counting path asks (hit, batch, badge, pixel, import): the
//!   list behind a bounded cache of verdicts, judged by [`crate::core::classify::filter_reason`].

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;

use crate::core::filtered::Reason;

/// The bundled pattern list (a JSON array of regular expressions).
pub const PATTERNS_JSON: &str = include_str!("../../data/bots/isbot-patterns.json");

/// Patterns per alternation. One alternation of all ~200 outgrows the lazy DFA's default cache
/// (2 MiB per thread) and falls back to a slower engine: 230 µs per agent in release builds;
/// chunks of 40 stay in the DFA: 7 µs (measured over both corpora, see ARCHITECTURE.md).
pub const CHUNK: usize = 40;

/// The compiled bot list.
pub struct BotList {
    /// Every pattern without look-around, as alternations of [`CHUNK`] patterns.
    plain: Vec<regex::bytes::Regex>,
    /// Patterns with look-around.
    lookaround: Vec<fancy_regex::Regex>,
    /// Each look-around pattern with its look-arounds removed (matches a superset), same order.
    prefilter: Option<regex::bytes::RegexSet>,
    /// Patterns that did not compile (none in the bundled list; see the tests).
    skipped: Vec<String>,
}

impl std::fmt::Debug for BotList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotList")
            .field("lookaround", &self.lookaround.len())
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Whether a pattern needs look-around (`(?=`, `(?!`, `(?<=`, `(?<!`).
fn has_lookaround(pattern: &str) -> bool {
    ["(?=", "(?!", "(?<=", "(?<!"]
        .iter()
        .any(|l| pattern.contains(l))
}

/// JavaScript reads a `-` next to a class escape inside brackets (`[\w\d-.]`) as a literal;
/// the `regex` crate refuses it. Escape exactly those.
fn js_class_dashes(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let is_class_escape = |i: usize| {
        chars.get(i) == Some(&'\\')
            && chars
                .get(i + 1)
                .is_some_and(|c| matches!(c, 'w' | 'W' | 'd' | 'D' | 's' | 'S'))
    };
    let mut out = String::with_capacity(pattern.len() + 4);
    let (mut i, mut in_class) = (0, false);
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            out.push(c);
            if let Some(&next) = chars.get(i + 1) {
                out.push(next);
            }
            i += 2;
            continue;
        }
        match c {
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '-' if in_class && ((i >= 2 && is_class_escape(i - 2)) || is_class_escape(i + 1)) => {
                out.push('\\');
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    out
}

/// `pattern` without its look-around groups: whatever it matches, this matches too.
fn without_lookaround(pattern: &str) -> String {
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            out.push_str(&pattern[i..(i + 2).min(b.len())]);
            i += 2;
            continue;
        }
        let rest = &pattern[i..];
        if ["(?=", "(?!", "(?<=", "(?<!"]
            .iter()
            .any(|l| rest.starts_with(l))
        {
            // Skip to the matching `)`.
            let (mut depth, mut j, mut class) = (0usize, i, false);
            while j < b.len() {
                match b[j] {
                    b'\\' => j += 1,
                    b'[' if !class => class = true,
                    b']' if class => class = false,
                    b'(' if !class => depth += 1,
                    b')' if !class => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            i = j + 1;
            continue;
        }
        let len = rest.chars().next().map_or(1, char::len_utf8);
        out.push_str(&rest[..len]);
        i += len;
    }
    out
}

fn plain_regex(pattern: &str) -> Result<regex::bytes::Regex, regex::Error> {
    regex::bytes::RegexBuilder::new(&js_class_dashes(pattern))
        .case_insensitive(true)
        .unicode(false)
        .build()
}

impl BotList {
    /// The list compiled into the binary.
    pub fn bundled() -> Self {
        let patterns: Vec<String> = serde_json::from_str(PATTERNS_JSON).unwrap_or_default();
        Self::from_patterns(&patterns)
    }

    /// A list from patterns written for JavaScript's `RegExp(…, "i")`.
    pub fn from_patterns(patterns: &[String]) -> Self {
        let mut plain = Vec::new();
        let mut lookaround = Vec::new();
        let mut cores = Vec::new();
        let mut skipped = Vec::new();
        for p in patterns {
            if has_lookaround(p) {
                let core = js_class_dashes(&without_lookaround(p));
                match fancy_regex::Regex::new(&format!("(?i){}", js_class_dashes(p))) {
                    Ok(r) if plain_regex(&core).is_ok() => {
                        lookaround.push(r);
                        cores.push(core);
                    }
                    _ => skipped.push(p.clone()),
                }
            } else if plain_regex(p).is_ok() {
                plain.push(format!("(?:{p})"));
            } else {
                skipped.push(p.clone());
            }
        }
        if !skipped.is_empty() {
            tracing::warn!(?skipped, "bot patterns that do not compile are skipped");
        }
        Self {
            plain: plain
                .chunks(CHUNK)
                .filter_map(|c| plain_regex(&c.join("|")).ok())
                .collect(),
            lookaround,
            prefilter: regex::bytes::RegexSetBuilder::new(&cores)
                .case_insensitive(true)
                .unicode(false)
                .build()
                .ok(),
            skipped,
        }
    }

    /// Whether `user_agent` is a bot's.
    pub fn is_bot(&self, user_agent: &str) -> bool {
        if user_agent.is_empty() {
            return false;
        }
        if self.plain.iter().any(|r| r.is_match(user_agent.as_bytes())) {
            return true;
        }
        let Some(prefilter) = &self.prefilter else {
            return false;
        };
        prefilter
            .matches(user_agent.as_bytes())
            .iter()
            .any(|i| self.lookaround[i].is_match(user_agent).unwrap_or(false))
    }

    /// Patterns that did not compile.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }
}

/// User agents whose bot verdict is remembered (by a 64-bit hash: 16 bytes an entry, however
/// long the agent).
pub const BOT_VERDICTS: usize = 4096;

/// The bot filter every counting path asks: the list, compiled once, behind a bounded cache of
/// recent verdicts (the list is a large regex; agents repeat).
pub struct BotFilter {
    list: BotList,
    verdicts: Mutex<HashMap<u64, bool>>,
    hasher: RandomState,
}

impl BotFilter {
    /// The filter of the bundled list.
    pub fn bundled() -> Self {
        Self::new(BotList::bundled())
    }

    pub fn new(list: BotList) -> Self {
        Self {
            list,
            verdicts: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        }
    }

    /// Why a view from `user_agent` is not counted, if it is not
    /// ([`crate::core::classify::filter_reason`]: empty agents, and listed bots other than the
    /// known image proxies).
    pub fn reason(&self, user_agent: &str) -> Option<Reason> {
        crate::core::classify::filter_reason(user_agent, |ua| self.is_bot(ua))
    }

    /// Whether `user_agent` is on the list (cached by hash for the most recent agents).
    pub fn is_bot(&self, user_agent: &str) -> bool {
        let key = self.hasher.hash_one(user_agent);
        let cached = self.verdicts.lock().ok().and_then(|c| c.get(&key).copied());
        if let Some(verdict) = cached {
            return verdict;
        }
        let verdict = self.list.is_bot(user_agent);
        if let Ok(mut cache) = self.verdicts.lock() {
            if cache.len() >= BOT_VERDICTS {
                cache.clear();
            }
            cache.insert(key, verdict);
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_pattern_compiles() {
        let patterns: Vec<String> = serde_json::from_str(PATTERNS_JSON).expect("a JSON array");
        assert!(patterns.len() > 100, "{} patterns", patterns.len());
        let list = BotList::bundled();
        assert!(list.skipped().is_empty(), "{:?}", list.skipped());
        assert_eq!(
            list.plain.len(),
            (patterns.len() - list.lookaround.len()).div_ceil(CHUNK)
        );
    }

    #[test]
    fn javascript_class_dashes_are_literal() {
        assert_eq!(js_class_dashes(r"[\w\d-.]+"), r"[\w\d\-.]+");
        assert_eq!(js_class_dashes(r"[a-z-\d]"), r"[a-z\-\d]");
        assert_eq!(js_class_dashes(r"[a-z]-\d"), r"[a-z]-\d");
        assert_eq!(js_class_dashes(r"\[\d-x"), r"\[\d-x");
        let list = BotList::from_patterns(&[r"^x[\w\d-.]+$".to_owned()]);
        assert!(list.is_bot("x-a.b"));
        assert!(!list.is_bot("x a"));
    }

    #[test]
    fn lookarounds_are_removed_for_the_prefilter() {
        assert_eq!(
            without_lookaround(r"(?<! channel/|google/)google(?!(?:wv|app|/google| pixel))"),
            "google"
        );
        assert_eq!(without_lookaround(r"java(?!;)"), "java");
        assert_eq!(without_lookaround(r"(?<!\()x(?=[)])y"), "xy");
        assert_eq!(without_lookaround(r"(?:^|[^g])news"), r"(?:^|[^g])news");
    }

    #[test]
    fn known_agents() {
        let list = BotList::bundled();
        for bot in [
            "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "WhatsApp/2.23.20.0",
            "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GoogleOther)",
            "meta-externalagent/1.1 (+https://developers.facebook.com/docs/sharing/webmasters/crawler)",
            "Claude-User/1.0; +Claude-User@anthropic.com",
            "curl/8.5.0",
            "python-requests/2.31.0",
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/126.0 Safari/537.36",
        ] {
            assert!(list.is_bot(bot), "{bot}");
        }
        for person in [
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
            "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Mobile Safari/537.36",
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:128.0) Gecko/20100101 Firefox/128.0",
            "",
        ] {
            assert!(!list.is_bot(person), "{person}");
        }
    }

    #[test]
    fn lookaround_patterns_keep_their_exceptions() {
        let list = BotList::bundled();
        // `(?<!cam)scan`: a scanner is a bot, a camscanner app is not.
        assert!(list.is_bot("Mozilla/5.0 Nikto-scan"));
        assert!(!list.is_bot(
            "Mozilla/5.0 (Linux; Android 13) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Mobile Safari/537.36 CamScanner"
        ));
    }
}
