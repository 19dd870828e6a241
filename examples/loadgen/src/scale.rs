//! `tally-loadgen scale`: the do-nothing baseline, tally on SQLite, and tally on PostgreSQL with
//! 1, 2 and 3 collectors (optionally sharing a Redis), driven in ONE run with the same mix and
//! the same total connections (split evenly over the collectors), so the rows compare. Every
//! tally row starts on a fresh database (a new SQLite file; a new PostgreSQL schema, made and
//! dropped with `psql`, which must be on the PATH). Prints hits/s, p50, p99 and the ratio to the
//! baseline for each row, and where the host's cores went: CPU per answered hit of the
//! collectors, PostgreSQL, Redis and this generator, and how many cores they kept busy.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::drive::{Drive, LegitSource, Stats};
use crate::mix::{MixArgs, Plan};
use crate::run::print_row;
use crate::server::{self, Cpu, Server, load_average};

/// Options of `scale`.
#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// The tally binary (build it with --profile dist).
    #[arg(long, default_value = "target/dist/tally")]
    pub tally: PathBuf,
    /// PostgreSQL to measure (each row gets its own schema).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub postgres: String,
    /// Redis the PostgreSQL collectors share (none: each keeps its own state).
    #[arg(long)]
    pub redis: Option<String>,
    /// Seconds measured per row.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Connections in all, split evenly over the collectors of a row.
    #[arg(long, default_value_t = 64)]
    pub connections: usize,
    /// Most collectors on PostgreSQL (rows 1..=this).
    #[arg(long, default_value_t = 3)]
    pub max_collectors: usize,
    #[command(flatten)]
    pub mix: MixArgs,
}

const WARM_UP: Duration = Duration::from_millis(500);
/// Every collector of a row shares it (visitors hash alike everywhere).
const SECRET: &str = "tally-loadgen-scale-secret-0123456789abcdef";

/// Drive `servers` together for `duration`, the connections split evenly; one merged result.
async fn drive_all(
    servers: &[Server],
    connections: usize,
    mix: &MixArgs,
    salt: u64,
    duration: Duration,
) -> anyhow::Result<Stats> {
    let per = (connections / servers.len()).max(1);
    let mut tasks = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let drive = Drive {
            addr: s.addr,
            connections: per,
            source: LegitSource::One,
            // Each collector's clients are other visitors (as a balancer spreads them).
            plan: Plan::new(mix, salt.wrapping_mul(16).wrapping_add(i as u64)),
        };
        tasks.push(tokio::spawn(async move { drive.run(duration).await }));
    }
    let mut parts = Vec::new();
    for t in tasks {
        parts.push(t.await??);
    }
    Ok(Stats::combine(parts, duration))
}

/// [`drive_all`] for `duration`, with the CPU used meanwhile per answered request (µs):
/// (collectors, PostgreSQL, Redis, load generator).
async fn measured(
    servers: &[Server],
    connections: usize,
    mix: &MixArgs,
    salt: u64,
    duration: Duration,
) -> anyhow::Result<(Stats, [f64; 4])> {
    let refs: Vec<&Server> = servers.iter().collect();
    let before = Cpu::now(&refs)?;
    let stats = drive_all(servers, connections, mix, salt, duration).await?;
    let cpu = Cpu::now(&refs)?.since(&before).per_hit(stats.ok);
    Ok((stats, cpu))
}

/// `psql URL -c SQL`.
async fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let out = tokio::process::Command::new("psql")
        .args([url, "-qAtc", sql])
        .output()
        .await
        .context("psql (needed to make the benchmark's schemas)")?;
    if !out.status.success() {
        bail!("psql: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

pub async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    let load_before = load_average();
    let duration = Duration::from_secs(args.duration);
    let dir = server::TempDir::new()?;
    let mut rows: Vec<(String, Stats, [f64; 4])> = Vec::new();

    let base = server::spawn_baseline().await?;
    drive_all(
        std::slice::from_ref(&base),
        args.connections,
        &args.mix,
        1,
        WARM_UP,
    )
    .await?;
    let (b, cpu) = measured(
        std::slice::from_ref(&base),
        args.connections,
        &args.mix,
        2,
        duration,
    )
    .await?;
    base.stop().await?;
    rows.push(("baseline".into(), b, cpu));

    let common = format!(
        "--rate-limit-per-minute 0 --address-limit-per-minute 0 --auto-sites --new-sites-per-hour 0 --secret {SECRET}"
    );
    let db = dir.join("scale.sqlite");
    let sqlite = server::spawn_tally(&args.tally, &db, &common, &dir.join("sqlite.log")).await?;
    drive_all(
        std::slice::from_ref(&sqlite),
        args.connections,
        &args.mix,
        3,
        WARM_UP,
    )
    .await?;
    let (s, cpu) = measured(
        std::slice::from_ref(&sqlite),
        args.connections,
        &args.mix,
        4,
        duration,
    )
    .await?;
    sqlite.stop().await?;
    rows.push(("sqlite x1".into(), s, cpu));

    for n in 1..=args.max_collectors.max(1) {
        let schema = format!("tally_scale_{}_{n}", std::process::id());
        psql(&args.postgres, &format!("CREATE SCHEMA {schema}")).await?;
        let sep = if args.postgres.contains('?') {
            '&'
        } else {
            '?'
        };
        let url = format!("{}{sep}options=-csearch_path%3D{schema}", args.postgres);
        let mut extra = format!("{common} --db-pool {}", 16usize.div_ceil(n).max(4));
        if let Some(redis) = &args.redis {
            extra.push_str(&format!(
                " --redis {redis} --redis-prefix tally-scale:{schema}:"
            ));
        }
        let mut servers = Vec::new();
        for i in 0..n {
            let log = dir.join(&format!("pg{n}-{i}.log"));
            servers.push(
                server::spawn_tally(&args.tally, std::path::Path::new(&url), &extra, &log).await?,
            );
        }
        let salt = 10 + 2 * n as u64;
        let measured = async {
            drive_all(&servers, args.connections, &args.mix, salt, WARM_UP).await?;
            measured(&servers, args.connections, &args.mix, salt + 1, duration).await
        }
        .await;
        for s in servers {
            s.stop().await?;
        }
        psql(&args.postgres, &format!("DROP SCHEMA {schema} CASCADE")).await?;
        let (stats, cpu) = measured?;
        rows.push((format!("postgres x{n}"), stats, cpu));
    }

    println!(
        "load: {} connections in all (split over a row's collectors), {} s per row, realistic \
         mix {} visitors / {} pages; host: {} cores, load average {load_before} before, {} \
         after; PostgreSQL {} redis",
        args.connections,
        args.duration,
        args.mix.visitors,
        args.mix.pages,
        std::thread::available_parallelism().map_or(0, usize::from),
        load_average(),
        if args.redis.is_some() {
            "with"
        } else {
            "without"
        },
    );
    println!(
        "{:<14} {:>12} {:>10} {:>10} {:>8}",
        "server", "hits/s", "p50 ms", "p99 ms", "errors"
    );
    for (name, s, _) in &rows {
        print_row(name, s);
    }
    let base_rate = rows[0].1.rate();
    let ratios: Vec<String> = rows
        .iter()
        .skip(1)
        .map(|(name, s, _)| format!("{name} {:.2}", s.rate() / base_rate))
        .collect();
    println!("ratio to the baseline: {}", ratios.join(", "));
    // Where the cores went: every process on the host that serves the load, per answered hit
    // (read from /proc/<pid>/stat, 10 ms ticks; PostgreSQL and Redis are every process of
    // that name, so other work of theirs on the host counts too).
    println!(
        "CPU µs per answered hit: {:<12} {:>10} {:>10} {:>8} {:>10} {:>8} {:>11}",
        "server", "collectors", "postgres", "redis", "generator", "total", "cores busy"
    );
    for (name, s, cpu) in &rows {
        let total: f64 = cpu.iter().sum();
        println!(
            "{:<24} {name:<12} {:>10.1} {:>10.1} {:>8.1} {:>10.1} {total:>8.1} {:>11.2}",
            "",
            cpu[0],
            cpu[1],
            cpu[2],
            cpu[3],
            total * s.rate() / 1e6
        );
    }
    Ok(())
}
