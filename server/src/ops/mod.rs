//! What an operator runs besides the collector: configuration, imports, exports and email
//! reports.

pub mod config;
pub mod export;
pub mod import;
pub mod report;
