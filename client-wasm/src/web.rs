//! The browser binding: [`Host`] implemented over `js/host.js`, and the entry points the
//! loader and host functions call.
//!
//! Contract:
//! - Exports one entry point, `run(op, s, w, a, b, c)`: the start, each `window.tally(...)`
//!   call, a finished fetch, a timer, a history change and the page hiding, told apart by
//!   `op`. Codes and arguments are defined once, in [`crate::ops`].
//! - The one client lives in a module-level cell: the WebAssembly instance is the state holder
//!   of one page. A call that arrives while the client is busy (a re-entrant call from page
//!   code) or before `start` is ignored rather than panicking.
//! - `js/host.js` is inlined into the wasm-bindgen glue by `scripts/build-snippet.sh`, so the
//!   page downloads one JavaScript module besides the loader.

use crate::client::{Area, Client, Command, Host, Navigation, Options};
use crate::ops::{Num, Op, present};
use std::cell::RefCell;
use wasm_bindgen::prelude::*;

/// A tiny free-list allocator: std's dlmalloc alone would cost a third of the size budget.
/// The page's one thread makes the lock uncontended.
#[global_allocator]
static ALLOCATOR: lol_alloc::LockedAllocator<lol_alloc::FreeListAllocator> =
    lol_alloc::LockedAllocator::new(lol_alloc::FreeListAllocator::new());

#[wasm_bindgen(module = "/js/host.js")]
extern "C" {
    fn num(op: u32, x: u32) -> f64;
    fn rand(buf: &mut [u8]);
    fn load(area: u32, key: &str) -> String;
    fn save(area: u32, key: &str, value: &str) -> bool;
    fn send(api: &str, counts: bool, body: &str, id: &str) -> bool;
    fn busy(id: &str) -> bool;
    fn page(referrer: bool) -> String;
    fn same(url: &str, path_only: bool) -> bool;
    fn fill(answer: &str, busuanzi: bool);
    fn peek(api: &str, site: &str, busuanzi: bool);
}

/// The browser, as seen through `js/host.js`.
struct Web;

impl Host for Web {
    fn now_ms(&self) -> u64 {
        num(Num::Now as u32, 0) as u64
    }
    fn random(&self, buf: &mut [u8]) {
        rand(buf)
    }
    fn load(&self, area: Area, key: &str) -> String {
        load(area as u32, key)
    }
    fn save(&mut self, area: Area, key: &str, value: &str) -> bool {
        save(area as u32, key, value)
    }
    fn send(&mut self, api: &str, counts: bool, body: &str, id: &str) {
        send(api, counts, body, id);
    }
    fn awaiting(&self, id: &str) -> bool {
        busy(id)
    }
    fn beacon(&mut self, api: &str, body: &str) -> bool {
        send(api, false, body, "")
    }
    fn schedule(&mut self, delay_ms: u32) {
        num(Num::Later as u32, delay_ms);
    }
    fn href(&self) -> String {
        page(false)
    }
    fn same_page(&self, url: &str, path_only: bool) -> bool {
        same(url, path_only)
    }
    fn referrer(&self) -> String {
        page(true)
    }
    fn wants_counts(&self, busuanzi: bool) -> bool {
        num(Num::Want as u32, busuanzi.into()) != 0.0
    }
    fn fill(&mut self, answer: &str, busuanzi: bool) {
        fill(answer, busuanzi)
    }
    fn peek(&mut self, api: &str, site: &str, busuanzi: bool) {
        peek(api, site, busuanzi)
    }
    fn listen(&mut self, spa: bool) {
        num(Num::Listen as u32, spa.into());
    }
}

thread_local! {
    static CLIENT: RefCell<Option<Client<Web>>> = const { RefCell::new(None) };
}

/// The one entry point (one export keeps the glue small): `op` is an [`Op`], whose variants
/// say what `s`, `w`, `a`, `b` and `c` carry. Calls before the start, a second start, unknown
/// operations and commands, and re-entrant calls are ignored.
#[wasm_bindgen]
pub fn run(op: u32, s: u32, w: f64, a: &str, b: &str, c: &str) {
    let Some(op) = Op::from_code(op) else {
        return;
    };
    CLIENT.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return;
        };
        let Some(client) = slot.as_mut() else {
            if op == Op::Start {
                *slot = Some(Client::start(Web, Options::new(a.into(), b.into(), s)));
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
            Op::Answer => client.answer(b, s as u16, w as u64, present(a)),
            Op::Tick => client.tick(),
            Op::Hide => client.hide(),
            Op::Push => client.navigate(Navigation::Push),
            Op::Replace => client.navigate(Navigation::Replace),
            Op::Pop => client.navigate(Navigation::Pop),
        }
    });
}
