//! Slow and idle connections from the attacker's addresses: half connect and send nothing,
//! half send request headers one byte every [`TRICKLE_EVERY`] and never finish them. Each
//! socket stays until the server closes it (or answers, e.g. 408) or the deadline passes; the
//! report says how many were opened, refused, closed by the server and after how long.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{self, ConnectError};

/// Pause between two bytes of a trickling socket.
pub const TRICKLE_EVERY: Duration = Duration::from_millis(250);
/// The endless header a trickling socket sends.
const HEAD: &[u8] =
    b"POST /api/v1/hit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nX-Slow: ";

/// What became of the slow sockets.
#[derive(Debug, Default)]
pub struct SlowReport {
    pub asked: usize,
    pub opened: usize,
    pub refused: usize,
    pub failed: usize,
    /// Seconds after connecting at which the server closed (or answered) a socket.
    pub closed_after: Vec<f64>,
    pub open_at_end: usize,
}

enum Fate {
    Refused,
    Failed,
    Closed(Duration),
    Open,
}

/// Open `n` slow sockets spread over `sources`, hold them until `deadline`.
pub async fn slow_sockets(
    addr: SocketAddr,
    sources: &[IpAddr],
    n: usize,
    deadline: Instant,
) -> SlowReport {
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let source = sources[i % sources.len()];
        tasks.push(tokio::spawn(one(addr, source, i % 2 == 1, deadline)));
    }
    let mut report = SlowReport {
        asked: n,
        ..SlowReport::default()
    };
    for t in tasks {
        match t.await {
            Ok(Fate::Refused) => report.refused += 1,
            Ok(Fate::Failed) | Err(_) => report.failed += 1,
            Ok(Fate::Closed(after)) => {
                report.opened += 1;
                report.closed_after.push(after.as_secs_f64());
            }
            Ok(Fate::Open) => {
                report.opened += 1;
                report.open_at_end += 1;
            }
        }
    }
    report.closed_after.sort_by(f64::total_cmp);
    report
}

async fn one(addr: SocketAddr, source: IpAddr, trickle: bool, deadline: Instant) -> Fate {
    let mut stream = match client::open_socket(addr, Some(source)).await {
        Ok(s) => s,
        Err(ConnectError::Refused) => return Fate::Refused,
        Err(_) => return Fate::Failed,
    };
    let opened = Instant::now();
    let mut next_byte = 0usize;
    let mut buf = [0u8; 512];
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.into()) => return Fate::Open,
            // Any read result means the server acted: EOF/reset (closed) or an answer.
            _ = stream.read(&mut buf) => return Fate::Closed(opened.elapsed()),
            _ = tick.tick(), if trickle => {
                let byte = HEAD.get(next_byte).copied().unwrap_or(b'a');
                next_byte += 1;
                if stream.write_all(&[byte]).await.is_err() {
                    return Fate::Closed(opened.elapsed());
                }
            }
        }
    }
}
