//! Tally's collector as a library: the `tally` binary is a thin shell around [`run`], and the
//! integration tests call the same [`run`] on port 0.
//!
//! Module map (see ARCHITECTURE.md): [`core`] counts and validates without HTTP or storage;
//! [`store`] persists behind one trait; [`ingest`] batches writes into group commits;
//! [`http`] is the edge; [`sites`], [`privacy`], [`metrics`] and [`config`] support them.

pub mod config;
pub mod core;
pub mod http;
pub mod ingest;
pub mod limits;
pub mod metrics;
pub mod privacy;
pub mod serve;
pub mod sites;
pub mod store;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::ServeConfig;
use crate::core::clock::Clock;
use crate::http::AppState;
use crate::ingest::Ingest;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::store::sqlite::SqliteStore;

/// Open the configured SQLite store.
pub fn open_store(config: &ServeConfig) -> anyhow::Result<Arc<dyn Store>> {
    let store = SqliteStore::open(&config.db, config.sync)
        .map_err(|e| anyhow::anyhow!("cannot open database {}: {e}", config.db.display()))?;
    Ok(Arc::new(store))
}

/// Serve the collector on `listener` until `shutdown` resolves, then stop taking requests,
/// commit everything queued, and return.
pub async fn run(
    listener: TcpListener,
    config: ServeConfig,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let (ingest, writer) = Ingest::start(Arc::clone(&store), config.ingest, Arc::clone(&metrics));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let pruner = (config.retention_days > 0).then(|| {
        tokio::spawn(prune_loop(
            Arc::clone(&store),
            Arc::clone(&clock),
            config.retention_days,
            stop_rx,
        ))
    });
    let server = config.server;
    let state = AppState::new(store, ingest, clock, config, Arc::clone(&metrics));
    // Serves until `shutdown`, then within the grace period; handlers get the peer address as
    // `ConnectInfo<SocketAddr>` from the server loop.
    serve::serve(listener, http::app(state), server, metrics, shutdown).await;
    // The router (and with it every queue sender) is dropped now: the writer drains and stops.
    let _ = stop_tx.send(true);
    if let Some(pruner) = pruner {
        let _ = pruner.await;
    }
    writer.await?;
    Ok(())
}

async fn prune_loop(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    retention_days: u32,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let cutoff = clock.now().as_millisecond() - i64::from(retention_days) * 86_400_000;
        match store.prune(cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "pruned raw events past retention"),
            Err(e) => tracing::warn!(error = %e, "pruning failed; will retry"),
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
        }
    }
}
