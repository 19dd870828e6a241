//! Tally's browser client: counts a page view (and custom events) from one script tag, in a
//! WebAssembly module small enough for the snippet's size budget.
//!
//! Contract (docs/behaviour.md §3; user documentation in docs/site-owners.md):
//! - The loader `js/loader.js` (served as `/tally.js`) reads the script tag's `data-*`
//!   options, queues `window.tally(...)` calls, skips local pages and (optionally) Do Not
//!   Track, and instantiates this module with streaming compilation. It then calls the one
//!   export, `run(op, ...)`: to start, and for each `window.tally(...)` call; `js/host.js`
//!   calls it for answers, timers, history changes and page hides.
//! - [`ops`] defines, once, every operation code and argument between the JavaScript side
//!   and the module (the build substitutes the codes into the JS sources).
//! - [`client`] holds all behaviour as plain Rust over the [`client::Host`] trait; [`json`],
//!   [`ids`], [`retry`] and [`queue`] are its pure building blocks. They compile and are
//!   tested natively (`cargo test -p tally-client`).
//! - `web` (wasm32 only) binds the host trait to `js/host.js` and exports the entry point;
//!   nothing it exports ever throws into the page on bad input (all inputs are plain strings
//!   and numbers; every failure is swallowed or retried).
//! - The hits sent carry the fields of `tally_wire::Hit`, the wire format's one definition
//!   ([`json::hit`] writes them; its tests compare with serde_json on that type).

pub mod client;
pub mod ids;
pub mod json;
pub mod ops;
pub mod queue;
pub mod retry;

#[cfg(target_arch = "wasm32")]
mod web;
