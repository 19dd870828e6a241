//! Integration tests: real HTTP over loopback on port 0, a real SQLite file per test.

mod attack;
mod bad_input;
mod badge;
mod cli;
mod concurrency;
mod crash;
mod dashboard;
mod days;
mod hits;
mod import;
mod migration_fixture;
mod overload;
mod store_conformance;
mod store_migration;
mod store_size;
mod support;
