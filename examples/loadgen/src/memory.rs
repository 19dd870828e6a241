//! `tally-loadgen memory`: tally's peak RSS (VmHWM) after `visitors` distinct visitors in one
//! day, sent as full batches of 500 records to `POST /api/v1/events` over a few connections.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;

use crate::client;
use crate::mix::{CACHE_UA, hit_body};
use crate::server;

/// Options of `memory`.
#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    #[arg(long, default_value = "target/dist/tally")]
    pub tally: PathBuf,
    /// Distinct visitors to send.
    #[arg(long, default_value_t = 1_000_000)]
    pub visitors: u64,
    /// Concurrent connections.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Arguments for `tally serve` besides --listen and --db.
    #[arg(
        long,
        default_value = "--auto-sites --rate-limit-per-minute 0 --address-limit-per-minute 0 --new-sites-per-hour 0",
        allow_hyphen_values = true
    )]
    pub tally_args: String,
}

const BATCH: u64 = 500;
const TIMEOUT: Duration = Duration::from_secs(60);

pub async fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    let dir = server::TempDir::new()?;
    let db = dir.join("memory.sqlite");
    let tally =
        server::spawn_tally(&args.tally, &db, &args.tally_args, &dir.join("tally.log")).await?;
    let start_rss = tally.peak_rss_mb()?;
    let addr = tally.addr;
    let host = addr.to_string();
    let visitors = args.visitors;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.connections {
        let (next, host) = (Arc::clone(&next), host.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = client::connect(addr, None)
                .await
                .map_err(|e| anyhow::anyhow!("connect: {e:?}"))?;
            loop {
                let from = next.fetch_add(BATCH, Ordering::Relaxed);
                if from >= visitors {
                    return anyhow::Ok(());
                }
                let records: Vec<String> = (from..(from + BATCH).min(visitors))
                    .map(|i| {
                        let body = hit_body(
                            &uuid::Uuid::now_v7().to_string(),
                            &uuid::Uuid::new_v4().to_string(),
                            &format!("https://bench.example/p{}", i % 1000),
                            None,
                        );
                        String::from_utf8_lossy(&body).into_owned()
                    })
                    .collect();
                let body = Bytes::from(format!(r#"{{"events":[{}]}}"#, records.join(",")));
                let req = client::post(
                    "/api/v1/events",
                    &[
                        ("host", &host),
                        ("content-type", "text/plain;charset=UTF-8"),
                        ("user-agent", CACHE_UA),
                    ],
                    body,
                );
                let answer = conn
                    .send(req, TIMEOUT)
                    .await
                    .map_err(|e| anyhow::anyhow!("batch: {e:?}"))?;
                if answer.status != 200 {
                    bail!("batch answered {}", answer.status);
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let rss = tally.peak_rss_mb()?;
    let counts = {
        let mut conn = client::connect(addr, None)
            .await
            .map_err(|e| anyhow::anyhow!("connect: {e:?}"))?;
        let answer = conn
            .send(
                client::get("/api/v1/counts?site=bench&page=/p1", &[("host", &host)]),
                TIMEOUT,
            )
            .await
            .map_err(|e| anyhow::anyhow!("counts: {e:?}"))
            .context("counts")?;
        String::from_utf8_lossy(&answer.body).into_owned()
    };
    tally.stop().await?;
    println!(
        "sent {visitors} distinct visitors in {:.1} s ({:.0} hits/s, batches of {BATCH})",
        elapsed.as_secs_f64(),
        visitors as f64 / elapsed.as_secs_f64()
    );
    println!("counts: {counts}");
    println!("tally peak RSS: {rss:.1} MB (at start {start_rss:.1} MB; goal <= 100 MB)");
    Ok(())
}
