//! Integration tests: real HTTP over loopback on port 0, a real SQLite file per test.

mod bad_input;
mod badge;
mod cli;
mod concurrency;
mod connections;
mod crash;
mod dashboard;
mod days;
mod hits;
mod overload;
mod store_conformance;
mod support;
