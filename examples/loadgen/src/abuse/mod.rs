//! `tally-loadgen abuse`: what one hostile client costs legitimate traffic, in one run.
//!
//! Starts `tally serve` on a fresh SQLite file, then (a) drives legitimate traffic alone for
//! `duration` seconds, and (b) the same legitimate traffic (fresh visitor ids) while one hostile
//! client floods for `duration` seconds from its own loopback address(es), 127.0.0.2 upwards:
//! the [`attack`] kinds (rotating user agents, random site ids, 1 KiB paths and referrers, full
//! batches, 4 MiB and just-under-the-limit bodies, badge and pixel floods) plus [`slow`]
//! sockets. Legitimate traffic comes from 127.0.0.1 or, by default, from one address per
//! visitor in 127.1.0.0/16 — so a per-address limit can tell both apart, and legitimate
//! visitors each stay far below any sane per-address allowance.
//!
//! It reports legitimate hits/s and p99 alone and under attack, the attacker's requests by
//! answer, the database's growth (main file + WAL, sampled before and after each phase), the
//! server's peak RSS (VmHWM), and four goals as PASS/FAIL. It exits non-zero on a FAIL only
//! with `--strict`. The server is killed at the end, on error and on Ctrl-C.

mod attack;
mod slow;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::drive::{Drive, LegitSource, Stats};
use crate::mix::{MixArgs, Plan};
use crate::run::print_row;
use crate::server::{self, DbSize, load_average, mb};
use attack::{Kind, Payloads, Tally};

/// Options of `abuse`.
#[derive(Debug, clap::Args)]
pub struct AbuseArgs {
    /// The tally binary (build it with --profile dist).
    #[arg(long, default_value = "target/dist/tally")]
    pub tally: PathBuf,
    /// Seconds of each phase: legitimate traffic alone, then under attack.
    #[arg(long, default_value_t = 15)]
    pub duration: u64,
    /// Concurrent legitimate connections.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Where legitimate traffic comes from.
    #[arg(long, value_enum, default_value_t = LegitSource::Visitor)]
    pub legit_source: LegitSource,
    /// Source addresses of the attacker: 127.0.0.2 and up.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=250))]
    pub attacker_addrs: u8,
    /// Attacker connections per flood kind (the huge bodies get half).
    #[arg(long, default_value_t = 2)]
    pub attack_workers: usize,
    /// Flood kinds to run (comma-separated; default all), to find which one hurts.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Kind::ALL)]
    pub attack_kinds: Vec<Kind>,
    /// Slow and idle attacker sockets.
    #[arg(long, default_value_t = 300)]
    pub slow_sockets: usize,
    /// Records per minute and attacker address the server should store at most (the goal's
    /// allowance; today's default per-source limit is 120).
    #[arg(long, default_value_t = 120)]
    pub allowance_per_minute: u64,
    /// Disk bytes one allowed hostile record may cost (1 KiB path + 1 KiB referrer + indexes).
    #[arg(long, default_value_t = 4096)]
    pub allowance_record_bytes: u64,
    /// Arguments for `tally serve` besides --listen and --db.
    #[arg(long, default_value = "--auto-sites", allow_hyphen_values = true)]
    pub tally_args: String,
    /// Exit non-zero when a goal fails.
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub mix: MixArgs,
}

/// Goals.
const MIN_THROUGHPUT_RATIO: f64 = 0.8;
const MAX_P99_MS: f64 = 25.0;
const MAX_RSS_MB: f64 = 200.0;
/// How often the database size and RSS are sampled during a phase.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Time a worker may take beyond the deadline (its last request's timeout) before it is cut.
const WORKER_GRACE: Duration = Duration::from_secs(15);

fn attacker_ip(i: usize, addrs: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % usize::from(addrs)) as u8))
}

/// Largest database size and RSS seen while sampling.
#[derive(Default)]
struct Peaks {
    db: u64,
    rss_mb: f64,
}

async fn sample_until(db: &Path, server: &server::Server, deadline: Instant) -> Peaks {
    let mut peaks = Peaks::default();
    loop {
        peaks.db = peaks.db.max(DbSize::of(db).total());
        peaks.rss_mb = peaks.rss_mb.max(server.rss_mb().unwrap_or(0.0));
        if Instant::now() >= deadline {
            return peaks;
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

pub async fn abuse(args: AbuseArgs) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.duration);
    let load_before = load_average();
    let dir = server::TempDir::new()?;
    let db = dir.join("abuse.sqlite");
    let mut server =
        server::spawn_tally(&args.tally, &db, &args.tally_args, &dir.join("tally.log")).await?;
    let legit = |salt| Drive {
        addr: server.addr,
        connections: args.connections,
        source: args.legit_source,
        plan: Plan::new(&args.mix, salt),
    };

    // Warm up (creates the site, fills caches), then (a) legitimate traffic alone.
    legit(1).run(Duration::from_secs(1)).await?;
    let s0 = DbSize::of(&db);
    let t0 = Instant::now();
    let drive_a = legit(2);
    let (alone, peaks_a) = tokio::join!(
        drive_a.run(duration),
        sample_until(&db, &server, t0 + duration)
    );
    let alone = alone?;
    let s1 = DbSize::of(&db);
    let t1 = Instant::now();
    let rss_a = server.peak_rss_mb().unwrap_or(f64::NAN);

    // (b) the same traffic while the attacker floods.
    let deadline = t1 + duration;
    let attackers: Vec<IpAddr> = (0..usize::from(args.attacker_addrs))
        .map(|i| attacker_ip(i, args.attacker_addrs))
        .collect();
    let slow = {
        let (addr, sources, n) = (server.addr, attackers.clone(), args.slow_sockets);
        tokio::spawn(async move { slow::slow_sockets(addr, &sources, n, deadline).await })
    };
    let payloads = Arc::new(Payloads::default());
    let mut workers = Vec::new();
    for kind in args.attack_kinds.iter().copied() {
        for w in 0..kind.workers(args.attack_workers) {
            let source = attackers[(workers.len() + w) % attackers.len()];
            let seed = args.mix.seed ^ ((workers.len() as u64 + 1) << 32);
            let (addr, payloads) = (server.addr, Arc::clone(&payloads));
            let task = tokio::spawn(attack::worker(kind, addr, source, deadline, seed, payloads));
            workers.push((kind, task));
        }
    }
    let drive_b = legit(3);
    let (under, peaks_b) =
        tokio::join!(drive_b.run(duration), sample_until(&db, &server, deadline));
    let under = under?;
    let mut by_kind: Vec<(Kind, Tally)> = args
        .attack_kinds
        .iter()
        .map(|k| (*k, Tally::default()))
        .collect();
    let mut cut = 0;
    for (kind, task) in workers {
        let abort = task.abort_handle();
        match tokio::time::timeout_at((deadline + WORKER_GRACE).into(), task).await {
            Ok(Ok(t)) => {
                if let Some((_, sum)) = by_kind.iter_mut().find(|(k, _)| *k == kind) {
                    sum.add(&t);
                }
            }
            Ok(Err(e)) => bail!("attack worker failed: {e}"),
            Err(_) => {
                abort.abort();
                cut += 1;
            }
        }
    }
    let slow = slow.await?;
    let s2 = DbSize::of(&db);
    let t2 = Instant::now();
    let rss_b = server.peak_rss_mb().unwrap_or(f64::NAN);
    let exited = server.exited();
    let tail = server.log_tail(15);
    server.stop().await?;

    let report = Report {
        args: &args,
        alone: &alone,
        under: &under,
        by_kind: &by_kind,
        slow: &slow,
        sizes: [s0, s1, s2],
        minutes: [
            t1.duration_since(t0).as_secs_f64() / 60.0,
            t2.duration_since(t1).as_secs_f64() / 60.0,
        ],
        peaks: [peaks_a, peaks_b],
        rss: [rss_a, rss_b],
        attackers: &attackers,
        cut,
        load: [load_before, load_average()],
    };
    let failed = report.print();
    if let Some(status) = exited {
        println!("tally EXITED during the run ({status}); log tail:\n{tail}");
    }
    if args.strict && (failed > 0 || exited.is_some()) {
        bail!("{failed} goal(s) failed");
    }
    Ok(())
}

struct Report<'a> {
    args: &'a AbuseArgs,
    alone: &'a Stats,
    under: &'a Stats,
    by_kind: &'a [(Kind, Tally)],
    slow: &'a slow::SlowReport,
    /// Database before (a), after (a), after (b).
    sizes: [DbSize; 3],
    /// Minutes of (a) and (b), as measured between the size samples.
    minutes: [f64; 2],
    peaks: [Peaks; 2],
    /// VmHWM after (a) and after (b).
    rss: [f64; 2],
    attackers: &'a [IpAddr],
    cut: usize,
    /// The host's 1-minute load average before and after (other work skews the figures).
    load: [String; 2],
}

impl Report<'_> {
    /// Prints everything; returns the number of failed goals.
    fn print(&self) -> usize {
        let a = self.args;
        let legit_from = match a.legit_source {
            LegitSource::One => "127.0.0.1".to_owned(),
            LegitSource::Visitor => format!(
                "one address per visitor from {}",
                crate::drive::visitor_ip(0)
            ),
        };
        println!(
            "abuse: tally args {:?}; {} s per phase; legit: {} connections, {:?} mix, {} visitors, \
             {} pages, {}; attacker: {} from {}, {} workers per kind, {} slow sockets",
            a.tally_args,
            a.duration,
            a.connections,
            a.mix.mix,
            a.mix.visitors,
            a.mix.pages,
            legit_from,
            self.attackers.len(),
            self.attackers
                .first()
                .map(ToString::to_string)
                .unwrap_or_default(),
            a.attack_workers,
            a.slow_sockets,
        );
        println!("legit mix sent alone: {}", self.alone.mix_line());
        println!(
            "host: {} cores, load average {} before, {} after",
            std::thread::available_parallelism().map_or(0, usize::from),
            self.load[0],
            self.load[1]
        );
        println!();
        println!(
            "{:<14} {:>12} {:>10} {:>10} {:>8}",
            "legit", "hits/s", "p50 ms", "p99 ms", "errors"
        );
        print_row("alone", self.alone);
        print_row("under attack", self.under);
        let ratio = self.under.rate() / self.alone.rate();
        println!("ratio under attack / alone: {ratio:.2}");

        println!();
        println!("attacker requests by answer during (b):");
        println!(
            "{:<13} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>8} {:>7} {:>7} {:>8} {:>8}",
            "kind",
            "sent",
            "2xx",
            "429",
            "413",
            "4xx",
            "503",
            "5xx",
            "refused",
            "connerr",
            "closed",
            "timeout",
            "stored"
        );
        let mut total = Tally::default();
        for (kind, t) in self.by_kind {
            total.add(t);
            print_tally(kind.name(), t);
        }
        print_tally("total", &total);
        for (kind, t) in self.by_kind {
            if !t.codes.is_empty() {
                let codes: Vec<String> = t.codes.iter().map(|(c, n)| format!("{c} {n}")).collect();
                println!("  {} refusals: {}", kind.name(), codes.join(", "));
            }
        }
        if self.cut > 0 {
            println!(
                "({} attack workers were still waiting at the end and were cut)",
                self.cut
            );
        }
        let s = self.slow;
        let median = s
            .closed_after
            .get(s.closed_after.len() / 2)
            .map_or("-".to_owned(), |m| format!("{m:.1} s"));
        println!(
            "slow sockets: {} asked, {} opened, {} refused, {} failed to connect; closed by the \
             server: {} (median after {median}); still open at the end: {}",
            s.asked,
            s.opened,
            s.refused,
            s.failed,
            s.closed_after.len(),
            s.open_at_end
        );

        println!();
        let [s0, s1, s2] = self.sizes;
        let [ma, mb_] = self.minutes;
        println!(
            "database (file + WAL): before (a) {:.1} MB ({:.1} + {:.1}), after (a) {:.1} MB \
             ({:.1} + {:.1}), after (b) {:.1} MB ({:.1} + {:.1}); peak seen {:.1} MB",
            mb(s0.total()),
            mb(s0.file),
            mb(s0.wal),
            mb(s1.total()),
            mb(s1.file),
            mb(s1.wal),
            mb(s2.total()),
            mb(s2.file),
            mb(s2.wal),
            mb(self.peaks[0].db.max(self.peaks[1].db)),
        );
        let grow_a = s1.total().saturating_sub(s0.total()) as f64;
        let grow_b = s2.total().saturating_sub(s1.total()) as f64;
        let per_hit = grow_a / self.alone.accepted.max(1) as f64;
        let attacker_bytes = (grow_b - self.under.accepted as f64 * per_hit).max(0.0);
        let attacker_per_min = attacker_bytes / mb_;
        let allowance_per_min = (a.allowance_per_minute
            * self.attackers.len() as u64
            * a.allowance_record_bytes) as f64;
        let allowed_records = a.allowance_per_minute as f64 * self.attackers.len() as f64 * mb_;
        println!(
            "disk growth: alone {:.1} MB/min ({} legit hits stored, {per_hit:.0} bytes each); under \
             attack {:.1} MB/min; attacker's share ≈ {:.2} MB/min (growth minus legit hits × \
             {per_hit:.0} bytes)",
            mb(grow_a as u64) / ma,
            self.alone.accepted,
            mb(grow_b as u64) / mb_,
            mb(attacker_bytes as u64) / mb_,
        );
        println!(
            "attacker records stored (from the answers): {} in {:.2} min; allowance {:.0} \
             ({} per minute × {} address(es))",
            total.stored,
            mb_,
            allowed_records,
            a.allowance_per_minute,
            self.attackers.len()
        );
        println!(
            "server RSS: peak (VmHWM) {:.1} MB after (a), {:.1} MB after (b); highest VmRSS sampled \
             {:.1} / {:.1} MB",
            self.rss[0], self.rss[1], self.peaks[0].rss_mb, self.peaks[1].rss_mb
        );

        println!();
        println!("goals:");
        let goals = [
            (
                format!(
                    "legit throughput under attack >= {:.0}% of alone",
                    MIN_THROUGHPUT_RATIO * 100.0
                ),
                format!("{:.0}%", ratio * 100.0),
                ratio >= MIN_THROUGHPUT_RATIO,
            ),
            (
                format!("legit p99 under attack <= {MAX_P99_MS} ms"),
                format!("{:.2} ms", self.under.pct(0.99)),
                self.under.pct(0.99) <= MAX_P99_MS,
            ),
            (
                format!(
                    "attacker disk growth <= allowance ({} rec/min × {} addr × {} B = {:.2} MB/min)",
                    a.allowance_per_minute,
                    self.attackers.len(),
                    a.allowance_record_bytes,
                    mb(allowance_per_min as u64)
                ),
                format!("{:.2} MB/min", mb(attacker_per_min as u64)),
                attacker_per_min <= allowance_per_min,
            ),
            (
                format!("peak RSS <= {MAX_RSS_MB} MB"),
                format!("{:.1} MB", self.rss[1]),
                self.rss[1] <= MAX_RSS_MB,
            ),
        ];
        let mut failed = 0;
        for (goal, value, pass) in goals {
            failed += usize::from(!pass);
            println!(
                "  {:<4} {goal}: {value}",
                if pass { "PASS" } else { "FAIL" }
            );
        }
        failed
    }
}

fn print_tally(name: &str, t: &Tally) {
    println!(
        "{name:<13} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>8} {:>7} {:>7} {:>8} {:>8}",
        t.sent,
        t.ok,
        t.too_many,
        t.too_large,
        t.other_4xx,
        t.unavailable,
        t.other_5xx + t.other,
        t.refused,
        t.connect_failed,
        t.closed,
        t.timeouts,
        t.stored
    );
}
