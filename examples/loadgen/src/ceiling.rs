//! `tally-loadgen ceiling`: the least any durable collector must do, as a second reference
//! beside the do-nothing baseline, so a run says how much of the gap to the baseline is the
//! price of durability on this host rather than tally's own work.
//!
//! Per request it parses the body as a wire `Hit` (400 when it does not parse) and hands the
//! body to one writer thread; the writer writes every body queued meanwhile to a log file with
//! one `write` and one `fdatasync` (group commit, as tally's SQLite store does), then answers
//! each `{"status":"accepted"}`. It keeps no index, dedupes nothing, counts nothing and checks
//! no site, origin or bot: strictly less than tally must do, so its rate is about the most a
//! durable collector reaches with the same generator on the same cores (one batch is assumed
//! to fit the log: bodies of at most 8 KiB from at most a few thousand connections).

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tokio::sync::oneshot;

/// One body waiting for its sync.
type Job = (Bytes, oneshot::Sender<()>);

/// Bytes of the log, written out before the first request: the bodies then overwrite blocks
/// that already exist (from its start again when they reach its end), so each `fdatasync`
/// flushes data only, never a change of the file's size, as with SQLite's reused WAL.
const LOG_BYTES: u64 = 64 << 20;

/// The log file of `bytes` bytes, every block of it written and synced.
fn preallocated(path: PathBuf, bytes: u64) -> anyhow::Result<std::fs::File> {
    let mut file = std::fs::File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(zeros.len() as u64);
        file.write_all(&zeros[..n as usize])?;
        left -= n;
    }
    file.sync_all()?;
    Ok(file)
}

/// Write every queued body at the next offset of a log of `bytes` bytes, sync, answer; until
/// every sender is gone.
fn writer(file: std::fs::File, bytes: u64, jobs: mpsc::Receiver<Job>) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut at = 0u64;
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut waiting = Vec::new();
    while let Ok(first) = jobs.recv() {
        waiting.push(first);
        waiting.extend(jobs.try_iter());
        buf.clear();
        for (body, _) in &waiting {
            buf.extend_from_slice(body);
            buf.push(b'\n');
        }
        if at + buf.len() as u64 > bytes {
            at = 0;
        }
        file.write_all_at(&buf, at)?;
        at += buf.len() as u64;
        file.sync_data()?;
        for (_, reply) in waiting.drain(..) {
            let _ = reply.send(());
        }
    }
    Ok(())
}

/// Serve `POST /api/v1/hit` on a loopback port, logging to `path`; prints the address first.
pub async fn serve(path: PathBuf) -> anyhow::Result<()> {
    use axum::routing::post;
    let file = preallocated(path, LOG_BYTES)?;
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::spawn(move || {
        if let Err(e) = writer(file, LOG_BYTES, rx) {
            eprintln!("ceiling writer: {e}");
            std::process::exit(1);
        }
    });
    let app = axum::Router::new().route(
        "/api/v1/hit",
        post(move |body: Bytes| {
            let tx = tx.clone();
            async move {
                if serde_json::from_slice::<tally_wire::Hit>(&body).is_err() {
                    return (StatusCode::BAD_REQUEST, "{\"error\":\"malformed_json\"}")
                        .into_response();
                }
                let (reply, synced) = oneshot::channel();
                if tx.send((body, reply)).is_err() || synced.await.is_err() {
                    return StatusCode::SERVICE_UNAVAILABLE.into_response();
                }
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    "{\"status\":\"accepted\"}",
                )
                    .into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Send `bodies` to a writer over a log of `bytes` bytes, one at a time, each answered
    /// before the next is sent; returns the log's bytes after the last answer.
    fn log_after(bodies: &[&str], bytes: u64) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("log");
        let file = preallocated(path.clone(), bytes).expect("log");
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::spawn(move || writer(file, bytes, rx));
        for body in bodies {
            let (reply, synced) = oneshot::channel();
            tx.send((Bytes::from(body.to_string()), reply))
                .expect("send");
            synced.blocking_recv().expect("answered");
        }
        drop(tx);
        thread.join().expect("join").expect("writer");
        std::fs::read(path).expect("read")
    }

    #[test]
    fn a_body_is_in_the_log_when_it_is_answered() {
        let log = log_after(&["{\"a\":1}", "{\"b\":2}"], 64);
        assert_eq!(log.len(), 64, "the log keeps its size");
        assert_eq!(&log[..16], b"{\"a\":1}\n{\"b\":2}\n");
        assert!(log[16..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_body_that_would_pass_the_end_starts_the_log_again() {
        let log = log_after(&["0123456789", "abcdefghij"], 16);
        assert_eq!(&log[..11], b"abcdefghij\n");
    }
}
