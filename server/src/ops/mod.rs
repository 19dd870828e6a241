//! What an operator runs besides the collector: configuration, imports and exports.

pub mod config;
pub mod export;
pub mod import;
