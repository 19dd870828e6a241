//! Load and abuse benchmarks for the collector. Traffic goes to 127.0.0.0/8 only, and every
//! loop is bounded in time or count; the servers started are killed at the end, on error and
//! on Ctrl-C.
//!
//! - `run` measures throughput and latency: a do-nothing axum baseline, the least a durable
//!   collector must do ([`ceiling`]) and `tally serve` (fresh SQLite file), driven in the same
//!   run with the same mix and connections (`--rounds N` times, with medians); prints hits/s, p50,
//!   p99, the ratios to the baseline, tally's peak RSS, and the database bytes per stored
//!   hit (main file + WAL after a clean stop). The mix is realistic by default (see [`mix`]);
//!   `--mix cache` is the earlier cache-friendly one.
//! - `abuse` measures what one hostile client costs (see [`abuse`]): legitimate throughput
//!   and p99 alone and under a flood, the attacker's answers, disk growth, peak RSS, goals.
//! - `memory` measures tally's peak RSS after one million distinct visitors in one day.
//! - `scale` compares the baseline, SQLite and 1..3 collectors on PostgreSQL in one run.
//! - `import` measures a `tally import` while the server takes live load: the import's lines/s
//!   and live p99 idle vs during the import (see [`import`]).
//! - `seed` and `read` are the read benchmark: a year of a large site written through the
//!   store, then every dashboard and API read timed cold and warm (see [`history`]).
//! - `baseline` and `ceiling` are the reference servers `run` starts; `drive` drives a running
//!   server.

mod abuse;
mod ceiling;
mod client;
mod drive;
mod history;
mod import;
mod memory;
mod mix;
mod rng;
mod run;
mod scale;
mod server;

use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Load and abuse benchmarks for tally (loopback only)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Baseline vs tally throughput and latency, and database bytes per stored hit.
    Run(run::RunArgs),
    /// Legitimate traffic alone and under one hostile client's flood.
    Abuse(abuse::AbuseArgs),
    /// Peak RSS of tally after one million distinct visitors in one day.
    Memory(memory::MemoryArgs),
    /// Live p99 idle vs during a `tally import` on the same database, and the import's rate.
    Import(import::ImportArgs),
    /// Baseline, SQLite, and 1..3 collectors on PostgreSQL, in one run.
    Scale(scale::ScaleArgs),
    /// Write a site's history straight into a database through the store (read benchmark).
    Seed(history::SeedArgs),
    /// Time every dashboard panel and API read on a seeded database, cold and warm.
    Read(history::ReadArgs),
    /// The do-nothing baseline server (started by `run`).
    Baseline,
    /// The least a durable collector does: parse, group-committed append with fdatasync,
    /// answer after the sync (started by `run`).
    Ceiling {
        /// The file it appends to.
        #[arg(long)]
        file: std::path::PathBuf,
    },
    /// Drive an already running server (for profiling).
    Drive {
        #[arg(long)]
        addr: std::net::SocketAddr,
        #[arg(long, default_value_t = 10)]
        duration: u64,
        #[arg(long, default_value_t = 64)]
        connections: usize,
        #[arg(long, value_enum, default_value_t = drive::LegitSource::One)]
        legit_source: drive::LegitSource,
        #[command(flatten)]
        mix: mix::MixArgs,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let work = async move {
            match cli.command {
                Cmd::Baseline => baseline().await,
                Cmd::Ceiling { file } => ceiling::serve(file).await,
                Cmd::Drive {
                    addr,
                    duration,
                    connections,
                    legit_source,
                    mix,
                } => {
                    let d = drive::Drive {
                        addr,
                        connections,
                        source: legit_source,
                        plan: mix::Plan::new(&mix, 0),
                    };
                    let s = d.run(Duration::from_secs(duration)).await?;
                    println!(
                        "{:.0} hits/s p50 {:.2} ms p99 {:.2} ms errors {} ({})",
                        s.rate(),
                        s.pct(0.5),
                        s.pct(0.99),
                        s.errors(),
                        s.mix_line()
                    );
                    Ok(())
                }
                Cmd::Run(args) => run::run(args).await,
                Cmd::Abuse(args) => abuse::abuse(args).await,
                Cmd::Memory(args) => memory::memory(args).await,
                Cmd::Import(args) => import::import(args).await,
                Cmd::Scale(args) => scale::scale(args).await,
                Cmd::Seed(args) => history::seed(args).await,
                Cmd::Read(args) => history::read(args).await,
            }
        };
        // Dropping `work` drops its server handles, which kills the servers.
        tokio::select! {
            r = work => r,
            _ = interrupted() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    // Do not wait for straggling tasks (slow sockets, cut workers).
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Ctrl-C or SIGTERM.
async fn interrupted() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

async fn baseline() -> anyhow::Result<()> {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/api/v1/hit",
        post(|_body: Bytes| async { axum::http::StatusCode::NO_CONTENT }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
