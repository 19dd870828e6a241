//! The counting core: plain Rust that knows no HTTP and no database.
//!
//! Contract: everything here is deterministic given its inputs. Time comes in as a parameter
//! (see [`clock`]), never from `now()` inside logic; identifiers are parsed into types that
//! cannot hold an invalid value ([`ids`]); a raw hit becomes a [`hit::ValidHit`] or a typed
//! [`hit::HitError`] with a stable code; what a counting request counts as is decided once, in
//! [`classify`]. The HTTP edge, the stores and the shared state depend on this module, never
//! the other way round: nothing here imports anything outside `core`.

pub mod badge;
pub mod chart;
pub mod classify;
pub mod clock;
pub mod counts;
pub mod day;
pub mod dims;
pub mod display;
pub mod filtered;
pub mod forwarded;
pub mod gcra;
pub mod hit;
pub mod ids;
pub mod live;
pub mod net;
pub mod period;
pub mod query;
pub mod range;
pub mod record;
pub mod segment;
pub mod session;
pub mod site;
pub mod suppress;
