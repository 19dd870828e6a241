//! The servers under test as child processes: `tally serve` on a fresh SQLite file, the
//! do-nothing baseline and the durable ceiling. A [`Server`] is killed when dropped (error paths, Ctrl-C), stopped with
//! SIGTERM (so tally commits its queue and closes the database) by [`Server::stop`], and
//! observed from outside: peak and current RSS from `/proc/<pid>/status`, CPU time from
//! `/proc/<pid>/stat`, database bytes from the file sizes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to print its address, and to stop after SIGTERM.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A running server process.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    pub pid: u32,
    /// Where its stderr goes (tally's log), when kept.
    pub log: Option<PathBuf>,
}

/// Start `tally serve --listen 127.0.0.1:0 --db <db> <extra…>`; its log goes to `log`.
/// `extra` is split on whitespace (the `--tally-args` of every mode).
pub async fn spawn_tally(
    tally: &Path,
    db: &Path,
    extra: &str,
    log: &Path,
) -> anyhow::Result<Server> {
    if !tally.exists() {
        bail!(
            "{} not found: run `cargo build --profile dist -p tally` first",
            tally.display()
        );
    }
    let mut cmd = Command::new(tally);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(db);
    cmd.args(extra.split_whitespace());
    cmd.env("TALLY_LOG", "warn");
    let stderr = std::fs::File::create(log).context("server log")?;
    cmd.stderr(Stdio::from(stderr));
    spawn(cmd, Some(log.to_owned())).await
}

/// Start this program's `baseline` subcommand.
pub async fn spawn_baseline() -> anyhow::Result<Server> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("baseline").stderr(Stdio::null());
    spawn(cmd, None).await
}

/// Start this program's `ceiling` subcommand, appending to `file`.
pub async fn spawn_ceiling(file: &Path) -> anyhow::Result<Server> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("ceiling")
        .arg("--file")
        .arg(file)
        .stderr(Stdio::null());
    spawn(cmd, None).await
}

/// Start a process and read its address from its first line, `listening on http://ADDR`.
async fn spawn(mut cmd: Command, log: Option<PathBuf>) -> anyhow::Result<Server> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("no pid")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(START_TIMEOUT, lines.next_line())
        .await
        .context("server did not start in time")??
        .context("server exited before listening")?;
    let addr = line
        .strip_prefix("listening on http://")
        .with_context(|| format!("unexpected first line {line:?}"))?
        .parse()?;
    // Keep reading so a later line never meets a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Server {
        child,
        addr,
        pid,
        log,
    })
}

impl Server {
    /// The exit status if the process has ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Peak resident set (VmHWM) in MB.
    pub fn peak_rss_mb(&self) -> anyhow::Result<f64> {
        status_kb(self.pid, "VmHWM:").map(|kb| kb / 1024.0)
    }

    /// Current resident set (VmRSS) in MB.
    pub fn rss_mb(&self) -> anyhow::Result<f64> {
        status_kb(self.pid, "VmRSS:").map(|kb| kb / 1024.0)
    }

    /// CPU time (user + system, every thread) the process has used so far.
    pub fn cpu(&self) -> anyhow::Result<Duration> {
        cpu_of(&self.pid.to_string())
    }

    /// SIGTERM, then wait (SIGKILL after [`STOP_TIMEOUT`]). Returns whether it stopped by itself.
    pub async fn stop(mut self) -> anyhow::Result<bool> {
        if self.exited().is_some() {
            return Ok(true);
        }
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await
            .map(|s| s.success())
            .unwrap_or(false);
        if sent && let Ok(status) = tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            return Ok(status?.success());
        }
        self.child.kill().await?;
        Ok(false)
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        let Some(text) = self
            .log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
        else {
            return String::new();
        };
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

fn status_kb(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .with_context(|| format!("no {field}"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?)
}

/// CPU time (user + system, all threads) of `/proc/<pid>` (`self` for this process), from
/// fields 14 and 15 of its `stat`, in clock ticks of `USER_HZ` (100 on Linux).
pub fn cpu_of(pid: &str) -> anyhow::Result<Duration> {
    Ok(proc_stat(pid)?.1)
}

/// The command name and CPU time of `/proc/<pid>`.
fn proc_stat(pid: &str) -> anyhow::Result<(String, Duration)> {
    const USER_HZ: u64 = 100;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces and ')'.
    let (head, after) = stat.rsplit_once(')').context("malformed /proc stat")?;
    let comm = head.split_once('(').map_or("", |(_, c)| c).to_owned();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    let tick = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc stat")?.parse::<u64>()?)
    };
    let ticks = tick(11)? + tick(12)?;
    Ok((comm, Duration::from_millis(ticks * 1000 / USER_HZ)))
}

/// CPU time of every process whose command name is `comm` (e.g. all PostgreSQL backends).
/// Processes that exit between two readings drop out, so read around a window in which the
/// set stays the same (the collectors' pools connect before the warm-up).
fn cpu_of_command(comm: &str) -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Duration::ZERO;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|pid| proc_stat(&pid).ok())
        .filter(|(c, _)| c == comm)
        .map(|(_, t)| t)
        .sum()
}

/// CPU time used so far by the parts of one measurement.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// The servers under test (summed).
    pub servers: Duration,
    /// Every `postgres` process on the host.
    pub postgres: Duration,
    /// Every `redis-server` process on the host.
    pub redis: Duration,
    /// This load generator.
    pub generator: Duration,
}

impl Cpu {
    pub fn now(servers: &[&Server]) -> anyhow::Result<Self> {
        let mut total = Duration::ZERO;
        for s in servers {
            total += s.cpu()?;
        }
        Ok(Self {
            servers: total,
            postgres: cpu_of_command("postgres"),
            redis: cpu_of_command("redis-server"),
            generator: cpu_of("self")?,
        })
    }

    /// What was used between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            servers: self.servers.saturating_sub(earlier.servers),
            postgres: self.postgres.saturating_sub(earlier.postgres),
            redis: self.redis.saturating_sub(earlier.redis),
            generator: self.generator.saturating_sub(earlier.generator),
        }
    }

    /// µs of CPU per answered request: (servers, postgres, redis, generator).
    pub fn per_hit(&self, answered: u64) -> [f64; 4] {
        [self.servers, self.postgres, self.redis, self.generator]
            .map(|d| d.as_secs_f64() * 1e6 / answered.max(1) as f64)
    }
}

/// Bytes of a SQLite database on disk: the main file and its write-ahead log.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbSize {
    pub file: u64,
    pub wal: u64,
}

impl DbSize {
    pub fn of(db: &Path) -> Self {
        let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        Self {
            file: len(db),
            wal: len(Path::new(&wal)),
        }
    }

    pub fn total(self) -> u64 {
        self.file + self.wal
    }
}

/// A fresh temporary directory for one run's database and log, removed when dropped (also on
/// error and Ctrl-C).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("tally-bench-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// The host's 1-minute load average (other work on the host skews every figure).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}
