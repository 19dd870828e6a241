//! `tally-loadgen ceiling`: the least any durable collector must do, as a second reference
//! beside the do-nothing baseline, so a run says how much of the gap to the baseline is the
//! price of durability on this host rather than tally's own work.
//!
//! Per request it parses the body as a wire `Hit` (400 when it does not parse) and hands the
//! body to one writer thread; the writer appends every body queued meanwhile to one file with
//! one `write` and one `fdatasync` (group commit, as tally's SQLite store does), then answers
//! each `{"status":"accepted"}`. It keeps no index, dedupes nothing, counts nothing and checks
//! no site, origin or bot: strictly less than tally must do, so its rate bounds what any
//! durable collector can reach with the same generator on the same cores.

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use tokio::sync::oneshot;

/// One body waiting for its sync.
type Job = (Bytes, oneshot::Sender<()>);

/// Append every queued body, sync, answer; until every sender is gone.
fn writer(path: PathBuf, jobs: mpsc::Receiver<Job>) -> anyhow::Result<()> {
    let mut file = std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)?;
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
        file.write_all(&buf)?;
        file.sync_data()?;
        for (_, reply) in waiting.drain(..) {
            let _ = reply.send(());
        }
    }
    Ok(())
}

/// Serve `POST /api/v1/hit` on a loopback port, appending to `path`; prints the address first.
pub async fn serve(path: PathBuf) -> anyhow::Result<()> {
    use axum::routing::post;
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::spawn(move || {
        if let Err(e) = writer(path, rx) {
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
