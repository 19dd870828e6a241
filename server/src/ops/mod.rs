//! What an operator runs besides the collector: configuration, imports, exports, backups
//! and email reports.

pub mod backup;
pub mod config;
pub mod export;
pub mod import;
pub mod report;
