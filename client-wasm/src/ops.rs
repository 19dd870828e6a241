//! The calls between the JavaScript side (`js/loader.js`, `js/host.js`) and the module: the
//! one definition of every operation code, option flag and argument.
//!
//! Contract:
//! - The module exports one function, `run(op, s, w, a, b, c)` (one export keeps the glue
//!   small): `op` is an [`Op`], `s` a small number, `w` a float, `a`, `b`, `c` strings. What
//!   each argument means for each operation is written once, on the [`Op`] variants, and
//!   decoded once, by [`Call::decode`], into a typed [`Call`]; an empty string is an absent
//!   value (the one place that convention lives). Unknown codes decode to `None`.
//! - The host gives the module numbers through one import, `num(op, x)`: op is a [`Num`].
//! - `scripts/assemble-snippet.mjs` reads the `#[repr(u32)]` enums of this file and replaces
//!   every `Op.Name`, `Num.Name` and `Flag.Name` in the JS sources with its number before
//!   minifying; a name that is not defined here stops the build. So the codes have no second
//!   definition to drift from.
//! - A variant is `Name = number,` on one line (the build's reader depends on that form).

use crate::client::{Command, Navigation, Options};

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
    /// A fetch of a hit finished: `b` its event id, `s` the HTTP status (0 network error,
    /// 1 handed to `sendBeacon` instead: outcome unknown), `w` the `Retry-After` wait in ms
    /// (NaN, negative or absent all mean 0), `a` the answer's body.
    Answer = 2,
    /// A timer set through [`Num::Later`] fired.
    Tick = 3,
    /// The page is being hidden or unloaded.
    Hide = 4,
    /// `history.pushState` was called.
    Push = 5,
    /// `history.replaceState` was called.
    Replace = 6,
    /// A `popstate` event (back / forward).
    Pop = 7,
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
    /// Start reporting page hides and, when `x` is 1, history changes.
    Listen = 3,
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
}

impl Flag {
    /// Whether this flag is set in `bits`.
    pub fn is_in(self, bits: u32) -> bool {
        bits & self as u32 != 0
    }
}

/// One decoded call of `run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call<'a> {
    /// [`Op::Start`].
    Start(Options),
    /// [`Op::Command`].
    Command(Command),
    /// [`Op::Answer`].
    Answer {
        /// The event id the answer settles.
        id: &'a str,
        /// HTTP status, or 0 / 1 (see [`Op::Answer`]).
        status: u16,
        /// The `Retry-After` wait in ms, 0 when none.
        retry_after_ms: u64,
        /// The body, when not empty.
        body: Option<&'a str>,
    },
    /// [`Op::Tick`].
    Tick,
    /// [`Op::Hide`].
    Hide,
    /// [`Op::Push`], [`Op::Replace`], [`Op::Pop`].
    Navigate(Navigation),
}

impl<'a> Call<'a> {
    /// Decodes the arguments of `run`; `None` for an unknown operation or command.
    pub fn decode(op: u32, s: u32, w: f64, a: &'a str, b: &'a str, c: &'a str) -> Option<Self> {
        let present = |x: &'a str| (!x.is_empty()).then_some(x);
        Some(match op {
            0 => Call::Start(Options::new(a.to_owned(), b.to_owned(), s)),
            1 => Call::Command(Command::parse(a, s != 0, present(b), present(c))?),
            2 => Call::Answer {
                id: b,
                status: s.min(u16::MAX as u32) as u16,
                // `as` saturates: NaN and negative waits become 0.
                retry_after_ms: w as u64,
                body: present(a),
            },
            3 => Call::Tick,
            4 => Call::Hide,
            5 => Call::Navigate(Navigation::Push),
            6 => Call::Navigate(Navigation::Replace),
            7 => Call::Navigate(Navigation::Pop),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_matches_the_op_codes() {
        let d = |op: Op| Call::decode(op as u32, 0, 0.0, "", "", "");
        assert_eq!(d(Op::Tick), Some(Call::Tick));
        assert_eq!(d(Op::Hide), Some(Call::Hide));
        assert_eq!(d(Op::Push), Some(Call::Navigate(Navigation::Push)));
        assert_eq!(d(Op::Replace), Some(Call::Navigate(Navigation::Replace)));
        assert_eq!(d(Op::Pop), Some(Call::Navigate(Navigation::Pop)));
        assert_eq!(Call::decode(99, 0, 0.0, "", "", ""), None);
    }

    #[test]
    fn start_reads_site_api_and_flags() {
        let bits = Flag::Busuanzi as u32 | Flag::Consent as u32;
        let Some(Call::Start(o)) =
            Call::decode(Op::Start as u32, bits, 0.0, "blog", "https://c", "")
        else {
            panic!("a start");
        };
        assert_eq!((o.site.as_str(), o.api.as_str()), ("blog", "https://c"));
        assert!(o.busuanzi && o.consent && !o.storage && o.auto && o.spa);
    }

    #[test]
    fn answers_treat_empty_bodies_and_odd_waits_as_absent() {
        let a =
            |w: f64, body: &'static str| Call::decode(Op::Answer as u32, 503, w, body, "id", "");
        let want = |ms: u64, body: Option<&'static str>| {
            Some(Call::Answer {
                id: "id",
                status: 503,
                retry_after_ms: ms,
                body,
            })
        };
        assert_eq!(a(1500.0, "{}"), want(1500, Some("{}")));
        assert_eq!(a(f64::NAN, ""), want(0, None));
        assert_eq!(a(-5.0, ""), want(0, None));
    }

    #[test]
    fn commands_decode_by_kind() {
        fn c(
            kind: &'static str,
            on: u32,
            b: &'static str,
            dedupe: &'static str,
        ) -> Option<Call<'static>> {
            Call::decode(Op::Command as u32, on, 0.0, kind, b, dedupe)
        }
        assert_eq!(
            c("pageview", 0, "", ""),
            Some(Call::Command(Command::PageView))
        );
        assert_eq!(
            c("event", 1, "signup", "u1"),
            Some(Call::Command(Command::Event {
                name: "signup".into(),
                dedupe: Some("u1".into())
            }))
        );
        assert_eq!(c("event", 0, "", ""), None, "an event needs a name");
        assert_eq!(
            c("consent", 1, "true", ""),
            Some(Call::Command(Command::Consent(true)))
        );
        assert_eq!(
            c("consent", 0, "false", ""),
            Some(Call::Command(Command::Consent(false)))
        );
        assert_eq!(
            c("ignore", 1, "true", ""),
            Some(Call::Command(Command::Ignore(true)))
        );
        assert_eq!(
            c("refresh", 0, "", ""),
            Some(Call::Command(Command::Refresh))
        );
        assert_eq!(c("nonsense", 0, "", ""), None);
    }

    #[test]
    fn flags_are_distinct_bits() {
        let all = [
            Flag::NoStorage,
            Flag::Busuanzi,
            Flag::Manual,
            Flag::NoSpa,
            Flag::Consent,
        ];
        let mut seen = 0;
        for f in all {
            assert_eq!((f as u32).count_ones(), 1);
            assert!(!f.is_in(seen));
            seen |= f as u32;
        }
    }
}
