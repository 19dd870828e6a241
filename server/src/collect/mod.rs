//! The counting pipeline, free of any transport.

pub mod bots;
pub mod ingest;
pub mod privacy;
pub mod secrets;
pub mod sites;
