//! Integration tests: real HTTP over loopback on port 0, a real SQLite file per test.

mod attack;
mod bad_input;
mod badge;
mod badge_fixtures;
mod bots;
mod cli;
mod compression;
mod concurrency;
mod connections;
mod crash;
mod dashboard;
mod days;
mod events_api;
mod filtered;
mod hits;
mod import;
mod metrics;
mod migration_fixture;
mod overload;
mod privacy;
mod shared_conformance;
mod store_conformance;
mod store_migration;
mod store_size;
mod support;
mod trust;
