//! The legitimate-traffic driver: N concurrent keep-alive connections send the mix's steps to
//! `POST /api/v1/hit` until a deadline, one request at a time per connection, and record every
//! answer's latency and status. With `--legit-source visitor` each visitor has its own source
//! address (127.1.0.0/16 and up) and each visit its own connection, as browsers behind distinct
//! addresses do; with `one` all traffic comes from 127.0.0.1 over long-lived connections.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;

use crate::client::{self, ConnectError, Failure};
use crate::mix::{self, Generator, MixKind, Plan, Referrer, Step};

/// Longest wait for one legitimate answer; a timeout counts with this latency.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed connect, so a refusing server is not spun against.
const RECONNECT_PAUSE: Duration = Duration::from_millis(20);

/// Where legitimate traffic comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LegitSource {
    /// Everything from 127.0.0.1 over long-lived connections.
    One,
    /// One source address per visitor (127.1.0.1, 127.1.0.2, …), a connection per visit.
    Visitor,
}

/// The source address of visitor `i`: 127.1.0.1 upwards, skipping .0 and .255.
pub fn visitor_ip(i: usize) -> IpAddr {
    let i = i as u32 % (254 * 256 * 254);
    let (block, host) = (i / 254, i % 254 + 1);
    IpAddr::V4(Ipv4Addr::new(
        127,
        (1 + block / 256) as u8,
        (block % 256) as u8,
        host as u8,
    ))
}

/// What one drive measured.
#[derive(Default)]
pub struct Stats {
    /// Latency of every answered (or timed-out) request, sorted, in µs.
    pub latencies_us: Vec<u32>,
    /// (second of the drive the request started in, latency in µs) of the same requests,
    /// for [`Stats::timeline`].
    pub timed: Vec<(u32, u32)>,
    /// 2xx answers.
    pub ok: u64,
    /// Answers `accepted` (stored hits).
    pub accepted: u64,
    /// Answers by status.
    pub statuses: BTreeMap<u16, u64>,
    pub timeouts: u64,
    /// Connections closed under a request.
    pub closed: u64,
    pub connect_refused: u64,
    pub connect_failed: u64,
    /// What was sent.
    pub resends: u64,
    pub fresh: u64,
    pub new_pairs: u64,
    pub external: u64,
    pub internal: u64,
    pub elapsed: Duration,
}

impl Stats {
    /// Successful hits per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    /// Latency percentile in ms over every answered or timed-out request.
    pub fn pct(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.latencies_us[i]) / 1000.0
    }

    /// p99 and maximum latency (ms) per second of the drive, in order: a periodic stall
    /// shows as a second whose p99 stands out, which a whole-run p99 averages away.
    pub fn timeline(&self) -> Vec<(f64, f64)> {
        let mut by_second: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &(second, us) in &self.timed {
            by_second.entry(second).or_default().push(us);
        }
        by_second
            .into_values()
            .map(|mut v| {
                v.sort_unstable();
                let i = ((v.len() - 1) as f64 * 0.99).round() as usize;
                (f64::from(v[i]) / 1000.0, f64::from(v[v.len() - 1]) / 1000.0)
            })
            .collect()
    }

    /// Requests that did not end in a 2xx answer.
    pub fn errors(&self) -> u64 {
        let non_2xx: u64 = self
            .statuses
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(_, n)| n)
            .sum();
        non_2xx + self.timeouts + self.closed + self.connect_refused + self.connect_failed
    }

    /// Non-2xx answers and failures in one short line (empty when there were none).
    pub fn error_detail(&self) -> String {
        let mut parts: Vec<String> = self
            .statuses
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        for (name, n) in [
            ("timeout", self.timeouts),
            ("closed", self.closed),
            ("refused", self.connect_refused),
            ("connect failed", self.connect_failed),
        ] {
            if n > 0 {
                parts.push(format!("{name}: {n}"));
            }
        }
        parts.join(", ")
    }

    /// The shape of what was sent.
    pub fn mix_line(&self) -> String {
        let sent = (self.fresh + self.resends).max(1) as f64;
        let fresh = self.fresh.max(1) as f64;
        format!(
            "{:.1}% resends; of fresh views {:.1}% a new (visitor, page) pair, {:.1}% with an \
             external referrer, {:.1}% with the previous page as referrer",
            100.0 * self.resends as f64 / sent,
            100.0 * self.new_pairs as f64 / fresh,
            100.0 * self.external as f64 / fresh,
            100.0 * self.internal as f64 / fresh,
        )
    }

    /// Several drives that ran side by side for `elapsed`, as one.
    pub fn combine(parts: Vec<Stats>, elapsed: Duration) -> Stats {
        let mut all = Stats::default();
        for p in parts {
            all.merge(p);
        }
        all.latencies_us.sort_unstable();
        all.elapsed = elapsed;
        all
    }

    fn merge(&mut self, o: Stats) {
        self.latencies_us.extend(o.latencies_us);
        self.timed.extend(o.timed);
        self.ok += o.ok;
        self.accepted += o.accepted;
        for (s, n) in o.statuses {
            *self.statuses.entry(s).or_default() += n;
        }
        self.timeouts += o.timeouts;
        self.closed += o.closed;
        self.connect_refused += o.connect_refused;
        self.connect_failed += o.connect_failed;
        self.resends += o.resends;
        self.fresh += o.fresh;
        self.new_pairs += o.new_pairs;
        self.external += o.external;
        self.internal += o.internal;
    }
}

/// How to drive.
#[derive(Clone)]
pub struct Drive {
    pub addr: SocketAddr,
    pub connections: usize,
    pub source: LegitSource,
    pub plan: Arc<Plan>,
}

impl Drive {
    /// Drive for `duration`; returns when every connection has finished its last request.
    pub async fn run(&self, duration: Duration) -> anyhow::Result<Stats> {
        let started = Instant::now();
        let deadline = started + duration;
        let mut tasks = Vec::new();
        for c in 0..self.connections {
            let me = self.clone();
            tasks.push(tokio::spawn(async move {
                me.connection(c, started, deadline).await
            }));
        }
        let mut stats = Stats::default();
        for t in tasks {
            stats.merge(t.await?);
        }
        stats.latencies_us.sort_unstable();
        stats.elapsed = started.elapsed().max(duration);
        Ok(stats)
    }

    async fn connection(&self, c: usize, started: Instant, deadline: Instant) -> Stats {
        let mut stats = Stats::default();
        let mut generator = Generator::new(Arc::clone(&self.plan), c, self.connections);
        let mut conn: Option<client::Conn> = None;
        let mut current_visitor = usize::MAX;
        let host = self.addr.to_string();
        while Instant::now() < deadline {
            let step = generator.next_step();
            let source = match self.source {
                LegitSource::One => None,
                LegitSource::Visitor => {
                    if step.visitor != current_visitor {
                        conn = None;
                        current_visitor = step.visitor;
                    }
                    Some(visitor_ip(step.visitor))
                }
            };
            if conn.is_none() {
                match client::connect(self.addr, source).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        match e {
                            ConnectError::Refused => stats.connect_refused += 1,
                            _ => stats.connect_failed += 1,
                        }
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                        continue;
                    }
                }
            }
            let Some(open) = conn.as_mut() else { continue };
            count_sent(&mut stats, &step);
            let req = request(&self.plan.args.mix, &host, &step);
            let t = Instant::now();
            let second = t.duration_since(started).as_secs() as u32;
            match open.send(req, REQUEST_TIMEOUT).await {
                Ok(answer) => {
                    stats.latencies_us.push(micros(t.elapsed()));
                    stats.timed.push((second, micros(t.elapsed())));
                    *stats.statuses.entry(answer.status).or_default() += 1;
                    if (200..300).contains(&answer.status) {
                        stats.ok += 1;
                        if accepted(&answer.body) {
                            stats.accepted += 1;
                        }
                    }
                }
                Err(Failure::Timeout) => {
                    stats.latencies_us.push(micros(REQUEST_TIMEOUT));
                    stats.timed.push((second, micros(REQUEST_TIMEOUT)));
                    stats.timeouts += 1;
                    conn = None;
                }
                Err(Failure::Closed) => {
                    stats.closed += 1;
                    conn = None;
                }
            }
        }
        stats
    }
}

fn count_sent(stats: &mut Stats, step: &Step) {
    if step.resend {
        stats.resends += 1;
    } else {
        stats.fresh += 1;
        stats.new_pairs += u64::from(step.new_pair);
        match step.referrer {
            Referrer::None => {}
            Referrer::External => stats.external += 1,
            Referrer::Internal => stats.internal += 1,
        }
    }
}

fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX)) as u32
}

/// Whether a hit's answer says it was stored.
pub fn accepted(body: &[u8]) -> bool {
    serde_json::from_slice::<tally_wire::HitResponse>(body)
        .is_ok_and(|r| r.status == tally_wire::Status::Accepted)
}

fn request(
    mix: &MixKind,
    host: &str,
    step: &Step,
) -> hyper::Request<http_body_util::Full<bytes::Bytes>> {
    let path = "/api/v1/hit?t=1";
    match mix {
        MixKind::Cache => client::post(
            path,
            &[
                ("host", host),
                ("content-type", "text/plain;charset=UTF-8"),
                ("user-agent", mix::CACHE_UA),
            ],
            step.body.clone(),
        ),
        // What Chrome sends with a keepalive fetch of a text/plain body.
        MixKind::Realistic => client::post(
            path,
            &[
                ("host", host),
                ("content-type", "text/plain;charset=UTF-8"),
                ("user-agent", mix::DESKTOP_UA),
                ("origin", mix::ORIGIN),
                ("referer", &step.page_url),
                ("accept", "*/*"),
                ("accept-language", "en-US,en;q=0.9"),
                ("accept-encoding", "gzip, deflate, br, zstd"),
                ("sec-fetch-mode", "cors"),
                ("sec-fetch-site", "cross-site"),
            ],
            step.body.clone(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visitor_addresses_are_distinct_loopback_hosts() {
        let ips: std::collections::HashSet<IpAddr> = (0..70_000).map(visitor_ip).collect();
        assert_eq!(ips.len(), 70_000);
        for ip in &ips {
            let IpAddr::V4(v4) = ip else { panic!("not v4") };
            assert!(v4.is_loopback());
            assert!(v4.octets()[3] != 0 && v4.octets()[3] != 255);
            assert_ne!(*v4, Ipv4Addr::LOCALHOST);
        }
    }
}
