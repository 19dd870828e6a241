//! The browser binding: [`Host`] implemented over `js/host.js`, and the entry points the
//! loader and host functions call.
//!
//! Contract:
//! - Exports `start(site, api, flags)` (once), `cmd(kind, name, dedupe)` (each
//!   `window.tally(...)` call), `done(token, status, retry_after_ms, body)` (a fetch finished),
//!   `tick()` (a timer fired), `nav(kind)` (0 push, 1 replace, 2 popstate) and `hide()`
//!   (the page is being hidden).
//! - The one client lives in a module-level cell: the WebAssembly instance is the state holder
//!   of one page. A call that arrives while the client is busy (a re-entrant call from page
//!   code) or before `start` is ignored rather than panicking.
//! - `js/host.js` is inlined into the wasm-bindgen glue by `scripts/build-snippet.sh`, so the
//!   page downloads one JavaScript module besides the loader.

use crate::client::{Area, Client, Host, Navigation, Options};
use std::cell::RefCell;
use wasm_bindgen::prelude::*;

/// A tiny free-list allocator: std's dlmalloc alone would cost a third of the size budget.
/// The page's one thread makes the lock uncontended.
#[global_allocator]
static ALLOCATOR: lol_alloc::LockedAllocator<lol_alloc::FreeListAllocator> =
    lol_alloc::LockedAllocator::new(lol_alloc::FreeListAllocator::new());

#[wasm_bindgen(module = "/js/host.js")]
extern "C" {
    fn now() -> f64;
    fn rand(buf: &mut [u8]);
    fn load(area: u32, key: &str) -> Option<String>;
    fn save(area: u32, key: &str, value: &str) -> bool;
    fn send(url: &str, body: &str, token: u32) -> bool;
    fn later(ms: u32);
    fn page(referrer: bool) -> String;
    fn same(url: &str, path_only: bool) -> bool;
    fn want(busuanzi: bool) -> bool;
    fn fill(answer: &str, busuanzi: bool);
    fn listen(spa: bool);
}

/// The browser, as seen through `js/host.js`.
struct Web;

impl Host for Web {
    fn now_ms(&self) -> u64 {
        now() as u64
    }
    fn random(&self, buf: &mut [u8]) {
        rand(buf)
    }
    fn load(&self, area: Area, key: &str) -> Option<String> {
        load(area as u32, key)
    }
    fn save(&mut self, area: Area, key: &str, value: &str) -> bool {
        save(area as u32, key, value)
    }
    fn send(&mut self, url: &str, body: &str, token: u32) {
        send(url, body, token);
    }
    fn beacon(&mut self, url: &str, body: &str) -> bool {
        send(url, body, 0)
    }
    fn schedule(&mut self, delay_ms: u32) {
        later(delay_ms)
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
        want(busuanzi)
    }
    fn fill(&mut self, answer: &str, busuanzi: bool) {
        fill(answer, busuanzi)
    }
    fn listen(&mut self, spa: bool) {
        listen(spa)
    }
}

thread_local! {
    static CLIENT: RefCell<Option<Client<Web>>> = const { RefCell::new(None) };
}

/// Runs `f` on the started client; does nothing before `start` or when re-entered.
fn with_client(f: impl FnOnce(&mut Client<Web>)) {
    CLIENT.with(|cell| {
        if let Ok(mut slot) = cell.try_borrow_mut() {
            if let Some(client) = slot.as_mut() {
                f(client);
            }
        }
    });
}

/// Starts the client once; later calls are ignored.
#[wasm_bindgen]
pub fn start(site: String, api: String, flags: u32) {
    CLIENT.with(|cell| {
        if let Ok(mut slot) = cell.try_borrow_mut() {
            if slot.is_none() {
                *slot = Some(Client::start(Web, Options::new(site, api, flags)));
            }
        }
    });
}

/// One `window.tally(kind, name, {dedupe})` call.
#[wasm_bindgen]
pub fn cmd(kind: &str, name: Option<String>, dedupe: Option<String>) {
    with_client(|c| c.command(kind, name, dedupe));
}

/// The outcome of a send (see `Client::answer`).
#[wasm_bindgen]
/// `retry_after_ms` is the `Retry-After` wait as `js/host.js` read it (NaN, negative or absent
/// when none: all mean 0).
pub fn done(token: u32, status: u16, retry_after_ms: f64, body: Option<String>) {
    with_client(|c| c.answer(token, status, retry_after_ms as u64, body.as_deref()));
}

/// A timer fired.
#[wasm_bindgen]
pub fn tick() {
    with_client(Client::tick);
}

/// A history change: 0 pushState, 1 replaceState, 2 popstate.
#[wasm_bindgen]
pub fn nav(kind: u32) {
    let how = match kind {
        0 => Navigation::Push,
        1 => Navigation::Replace,
        _ => Navigation::Pop,
    };
    with_client(|c| c.navigate(how));
}

/// The page is being hidden or unloaded.
#[wasm_bindgen]
pub fn hide() {
    with_client(Client::hide);
}
