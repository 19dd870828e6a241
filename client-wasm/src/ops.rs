//! The calls between the JavaScript side (`js/loader.js`, `js/host.js`) and the module: the
//! one definition of every operation code, option flag and argument.
//!
//! Contract:
//! - The module exports one function, `run(op, s, w, a, b, c)` (one export keeps the glue
//!   small): `op` is an [`Op`], `s` a small number, `w` a float, `a`, `b`, `c` strings. What
//!   each argument means for each operation is written once, on the [`Op`] variants;
//!   arguments an operation does not use are `0` / `''`, and an empty string is an absent
//!   value ([`present`]). Unknown codes are ignored ([`Op::from_code`]). (A typed enum of
//!   decoded calls read better but cost 186 B gzip of WebAssembly.)
//! - The three strings cross into the module as one, `a`, `b` and `c` joined by [`SEP`]
//!   (the glue's `run` joins, [`split`] parts them): one string passed costs 81 B gzip less
//!   than three. Only `c` may hold the separator, so an operation's free-form text, which
//!   could (an answer's body), is its `c`; a separator in `a` or `b` shifts what follows,
//!   and every such value is invalid anyway (a site id, a command kind, an event name).
//! - The host gives the module numbers through one import, `num(op, x)`: op is a [`Num`].
//! - `scripts/assemble-snippet.mjs` reads the `#[repr(u32)]` enums of this file and replaces
//!   every `Op.Name`, `Num.Name` and `Flag.Name` in the JS sources with its number before
//!   minifying; a name that is not defined here stops the build. So the codes have no second
//!   definition to drift from.
//! - A variant is `Name = number,` on one line (the build's reader depends on that form).

/// What a call of `run(op, s, w, a, b, c)` reports. Unused arguments are `0` / `''`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// The loader starts the client, once per page: `a` site id, `b` collector base URL,
    /// `s` the [`Flag`] bits of the script tag's options.
    Start = 0,
    /// A `tally(kind, value, {dedupe})` call: `a` kind, `b` the value as text (an event's
    /// name), `s` 1 when the value is truthy (`tally('consent', true)`), `c` the dedupe key.
    Command = 1,
    /// A fetch of a hit finished: `a` its event id, `s` the HTTP status (0 network error,
    /// 1 handed to `sendBeacon` instead: outcome unknown), `w` the `Retry-After` wait in ms
    /// (NaN, negative or absent all mean 0), `c` the answer's body.
    Answer = 2,
    /// A timer set through [`Num::Later`] fired.
    Tick = 3,
    /// The page is being hidden or unloaded (`visibilitychange` to hidden, `pagehide`).
    Hide = 4,
    /// `history.pushState` was called.
    Push = 5,
    /// `history.replaceState` was called.
    Replace = 6,
    /// A `popstate` event (back / forward).
    Pop = 7,
    /// The window gained or lost focus, or the page became visible: the module asks
    /// [`Num::Engaged`] whether the visitor is engaged now.
    Attention = 8,
}

/// What a call of the host import `num(op, x)` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Num {
    /// The current Unix time in ms (`x` unused).
    Now = 0,
    /// Call `run(Op.Tick)` once after `x` ms.
    Later = 1,
    /// 1 when the page has, or may still get, counter elements (`x`: busuanzi ids too).
    Want = 2,
    /// Start reporting page hides, focus, visibility and, when `x` is 1, history changes.
    Listen = 3,
    /// 1 when the page is visible (`document.visibilityState`) and focused
    /// (`document.hasFocus()`), else 0 (`x` unused).
    Engaged = 4,
    /// The largest scroll depth, percent (0–100), seen since the last reset, including the
    /// current one; `x` 1 resets it to 0 (a new page view) and returns 0.
    Scroll = 5,
    /// `screen.width` in CSS pixels, 0 when unknown (`x` unused).
    Screen = 6,
    /// A random byte from `crypto.getRandomValues` (`x` unused).
    Random = 7,
}

/// Bits of `s` in [`Op::Start`]: the script tag's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Flag {
    /// `data-storage="none"`.
    NoStorage = 1,
    /// `data-busuanzi`.
    Busuanzi = 2,
    /// `data-auto="false"`.
    Manual = 4,
    /// `data-spa="false"`.
    NoSpa = 8,
    /// `data-storage="consent"`.
    Consent = 16,
    /// This browser is excluded from counting (`tally('ignore', true)`, remembered by the
    /// loader in `localStorage`).
    Ignored = 32,
}

impl Flag {
    /// Whether this flag is set in `bits`.
    pub fn is_in(self, bits: u32) -> bool {
        bits & self as u32 != 0
    }
}

impl Op {
    /// Every operation, in code order.
    pub const ALL: [Op; 9] = [
        Op::Start,
        Op::Command,
        Op::Answer,
        Op::Tick,
        Op::Hide,
        Op::Push,
        Op::Replace,
        Op::Pop,
        Op::Attention,
    ];

    /// The operation with this code.
    pub fn from_code(code: u32) -> Option<Op> {
        // A match, not `ALL.get(code)`: no table in the module's data (26 B gzip).
        Some(match code {
            0 => Op::Start,
            1 => Op::Command,
            2 => Op::Answer,
            3 => Op::Tick,
            4 => Op::Hide,
            5 => Op::Push,
            6 => Op::Replace,
            7 => Op::Pop,
            8 => Op::Attention,
            _ => return None,
        })
    }
}

/// The separator of `run`'s three strings (`scripts/assemble-snippet.mjs` joins with it).
pub const SEP: u8 = 0;

/// `run`'s joined strings parted again: `a`, `b` and, whole, the rest `c` (absent ones empty).
pub fn split(text: &str) -> (&str, &str, &str) {
    let (a, rest) = crate::queue::cut(text, SEP);
    let (b, c) = crate::queue::cut(rest, SEP);
    (a, b, c)
}

/// An optional string argument of `run`: empty means absent.
pub fn present(arg: &str) -> Option<&str> {
    (!arg.is_empty()).then_some(arg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (code, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, code);
            assert_eq!(Op::from_code(code as u32), Some(op));
        }
        assert_eq!(Op::from_code(Op::ALL.len() as u32), None);
    }

    #[test]
    fn flags_are_distinct_bits() {
        let all = [
            Flag::NoStorage,
            Flag::Busuanzi,
            Flag::Manual,
            Flag::NoSpa,
            Flag::Consent,
            Flag::Ignored,
        ];
        let mut seen = 0;
        for f in all {
            assert_eq!((f as u32).count_ones(), 1);
            assert!(!f.is_in(seen));
            seen |= f as u32;
        }
    }

    #[test]
    fn joined_strings_part_again_with_the_last_one_whole() {
        assert_eq!(split("a\0b\0c"), ("a", "b", "c"));
        assert_eq!(split("\0\0"), ("", "", ""));
        assert_eq!(split(""), ("", "", ""));
        assert_eq!(
            split("id\0\0body\0with\0zeros"),
            ("id", "", "body\0with\0zeros")
        );
    }

    #[test]
    fn absent_is_empty() {
        assert_eq!(present(""), None);
        assert_eq!(present("x"), Some("x"));
    }
}
