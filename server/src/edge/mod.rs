//! The edge: everything that speaks HTTP. [`serve`] owns connections (accept, HTTP/1 and
//! HTTP/2, the per-address shares, timeouts); [`http`] owns routes (extract, call the pipeline
//! or the store, answer). Nothing below the edge knows about HTTP.

pub mod http;
pub mod serve;
