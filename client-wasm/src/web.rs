//! The browser binding: [`Host`] implemented over `js/host.js`, and the entry points the
//! loader and host functions call.
//!
//! Contract:
//! - Exports one entry point, `run(op, s, w, a, b, c)`: the start, each `window.tally(...)`
//!   call, a finished fetch, a timer, a history change, a focus or visibility change and the
//!   page hiding, told apart by
//!   `op`. Codes and arguments are defined once, in [`crate::ops`].
//! - The one client lives in a module-level cell: the WebAssembly instance is the state holder
//!   of one page. A call that arrives while the client is busy (a re-entrant call from page
//!   code) or before `start` is ignored rather than panicking.
//! - `js/host.js` is inlined into the wasm-bindgen glue by `scripts/build-snippet.sh`, so the
//!   page downloads one JavaScript module besides the loader.

use crate::client::{Area, Client, Command, Host, Navigation, Options};
use crate::ops::{Num, Op, present, split};
use std::cell::RefCell;
use wasm_bindgen::prelude::*;

/// A tiny free-list allocator: std's dlmalloc alone would cost a third of the size budget.
/// The page's one thread makes the lock uncontended.
#[global_allocator]
static ALLOCATOR: lol_alloc::LockedAllocator<lol_alloc::FreeListAllocator> =
    lol_alloc::LockedAllocator::new(lol_alloc::FreeListAllocator::new());

// Small numbers and flags travel as `i32`: the glue passes an `i32` on as it is, where it
// converts a `u32` (`>>> 0`) and a `bool` (`!== 0`); host.js reads flags by truthiness.
#[wasm_bindgen(module = "/js/host.js")]
extern "C" {
    fn num(op: i32, x: i32) -> f64;
    fn load(area: i32, key: &str) -> String;
    fn save(area: i32, key: &str, value: &str) -> bool;
    fn send(api: &str, counts: i32, body: &str, id: &str) -> bool;
    fn is(s: &str, what: i32) -> bool;
    fn counts(a: &str, site: &str, busuanzi: i32);
}

/// `load`'s areas besides storage: the page's URL and its referrer.
const HREF: i32 = 2;
const REFERRER: i32 = 3;
const QUOTE: i32 = 4;
/// What `is` asks about `s`: the current URL but for the fragment, path, or a fetch in flight.
const SAME_URL: i32 = 0;
const AWAITING: i32 = 2;

/// The browser, as seen through `js/host.js`.
struct Web;

impl Host for Web {
    fn now_ms(&self) -> u64 {
        num(Num::Now as i32, 0) as u64
    }
    fn random(&self, buf: &mut [u8]) {
        // A byte per call: cheaper than passing the buffer (one import and its glue fewer).
        let mut i = 0;
        while i < buf.len() {
            buf[i] = num(Num::Random as i32, 0) as u8;
            i += 1;
        }
    }
    fn load(&self, area: Area, key: &str) -> String {
        load(area as i32, key)
    }
    fn save(&mut self, area: Area, key: &str, value: &str) -> bool {
        save(area as i32, key, value)
    }
    fn send(&mut self, api: &str, counts: bool, body: &str, id: &str) {
        send(api, counts.into(), body, id);
    }
    fn awaiting(&self, id: &str) -> bool {
        is(id, AWAITING)
    }
    fn beacon(&mut self, api: &str, body: &str) -> bool {
        send(api, 0, body, "")
    }
    fn schedule(&mut self, delay_ms: u32) {
        num(Num::Later as i32, delay_ms as i32);
    }
    fn href(&self) -> String {
        load(HREF, "")
    }
    fn same_page(&self, url: &str, path_only: bool) -> bool {
        is(url, SAME_URL + i32::from(path_only))
    }
    fn referrer(&self) -> String {
        load(REFERRER, "")
    }
    fn wants_counts(&self, busuanzi: bool) -> bool {
        num(Num::Want as i32, busuanzi.into()) != 0.0
    }
    fn fill(&mut self, answer: &str, busuanzi: bool) {
        counts(answer, "", busuanzi.into())
    }
    fn peek(&mut self, api: &str, site: &str, busuanzi: bool) {
        counts(api, site, busuanzi.into())
    }
    fn listen(&mut self, spa: bool) {
        num(Num::Listen as i32, spa.into());
    }
    fn engaged(&self) -> bool {
        num(Num::Engaged as i32, 0) != 0.0
    }
    fn scroll(&mut self, reset: bool) -> u8 {
        // `as` saturates: NaN becomes 0.
        num(Num::Scroll as i32, reset.into()) as u8
    }
    fn screen_width(&self) -> u32 {
        num(Num::Screen as i32, 0) as u32
    }
    fn quote(&self, s: &str) -> String {
        load(QUOTE, s)
    }
}

thread_local! {
    static CLIENT: RefCell<Option<Client<Web>>> = const { RefCell::new(None) };
}

/// The one entry point (one export keeps the glue small): `op` is an [`Op`], whose variants
/// say what `s`, `w`, `a`, `b` and `c` carry; the strings come joined ([`split`]). Calls
/// before the start, a second start, unknown operations and commands, and re-entrant calls
/// are ignored.
#[wasm_bindgen]
pub fn run(op: u32, s: u32, w: f64, text: &str) {
    let (a, b, c) = split(text);
    let Some(op) = Op::from_code(op) else {
        return;
    };
    CLIENT.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return;
        };
        let Some(client) = slot.as_mut() else {
            if op == Op::Start {
                // Not `*slot = Some(..)`: that would drop the old value, and the drop code of
                // a whole client (it is never dropped) cost 31 B gzip.
                slot.get_or_insert_with(|| Client::start(Web, Options::new(a.into(), b.into(), s)));
            }
            return;
        };
        match op {
            Op::Start => {}
            Op::Command => {
                if let Some(command) = Command::parse(a, s != 0, present(b), present(c)) {
                    client.command(command);
                }
            }
            // `as` saturates: a NaN or negative wait becomes 0.
            Op::Answer => client.answer(a, s as u16, w as u64, present(c)),
            Op::Tick => client.tick(),
            Op::Hide => client.hide(),
            Op::Push => client.navigate(Navigation::Push),
            Op::Replace => client.navigate(Navigation::Replace),
            Op::Pop => client.navigate(Navigation::Pop),
            Op::Attention => client.attention(),
        }
    });
}
