//! Tally's collector as a library: the `tally` binary is a thin shell around [`run`], and the
//! integration tests call the same [`run`] on port 0.
//!
//! Module map (see ARCHITECTURE.md), each layer using only those below it:
//! - [`edge`]: HTTP (connections in `edge::serve`, routes in `edge::http`);
//! - [`ops`]: what an operator runs (configuration, import, export);
//! - [`collect`]: the counting pipeline, free of any transport;
//! - [`state`]: what several collectors share (live window, limits, repeat gate, site cache),
//!   in process or on Redis;
//! - [`store`]: persistence, on SQLite or PostgreSQL;
//! - [`core`]: the domain's types and rules, without I/O;
//! - [`metrics`]: what every layer reports, for `/metrics`.

pub mod collect;
pub mod core;
pub mod edge;
pub mod metrics;
pub mod ops;
pub mod state;
pub mod store;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::collect::ingest::Ingest;
use crate::collect::privacy::SourceHasher;
use crate::collect::sites::SiteRegistry;
use crate::collect::{CollectParts, Collector};
use crate::core::clock::Clock;
use crate::edge::http::AppState;
use crate::edge::http::auth::Auth;
use crate::metrics::Metrics;
use crate::ops::config::{Database, ServeConfig};
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::sqlite::{SqliteStore, StoreOptions};
use crate::store::{Maintenance, Retention, SaltStore, Store};

/// Open the configured store: the SQLite file, or the PostgreSQL database of a
/// `postgres://` URL (see [`Database`]).
pub async fn open_store(config: &ServeConfig) -> anyhow::Result<Arc<dyn Store>> {
    match &config.db {
        Database::Sqlite(_) => Ok(Arc::new(open_sqlite(config)?)),
        Database::Postgres(url) => Ok(Arc::new(open_postgres(config, url).await?)),
    }
}

/// Open the PostgreSQL database at `url` with the configured pool and page cap.
pub async fn open_postgres(config: &ServeConfig, url: &str) -> anyhow::Result<PgStore> {
    let options = PgOptions {
        pool_size: config.db_pool,
        max_new_pages_per_day: config.max_new_pages_per_day,
        schema: None,
    };
    PgStore::open(url, options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open database {}: {e}", config.db))
}

/// Open the configured SQLite store as itself (`copy-to` and SQLite backups use its own API).
pub fn open_sqlite(config: &ServeConfig) -> anyhow::Result<SqliteStore> {
    let Some(path) = config.db.sqlite_path() else {
        anyhow::bail!(
            "this command works on a SQLite database file; {} is PostgreSQL",
            config.db
        );
    };
    let options = StoreOptions {
        sync: config.sync,
        min_free_bytes: config.min_free_bytes,
        max_new_pages_per_day: config.max_new_pages_per_day,
    };
    SqliteStore::open(path, options)
        .map_err(|e| anyhow::anyhow!("cannot open database {}: {e}", path.display()))
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
    // Before anything starts: a missing or unreadable secret is a clear startup error.
    let secret = collect::secrets::ServerSecret::load(&config.secret)?;
    let metrics = Arc::new(Metrics::new());
    let (ingest, writer) = Ingest::start(store.clone(), config.ingest, Arc::clone(&metrics));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let pruner = tokio::spawn(upkeep_loop(
        store.clone(),
        collect::seal::Sealer {
            sites: store.clone(),
            segments: store.clone(),
        },
        Arc::clone(&clock),
        Retention {
            raw_days: config.retention_days,
            visitor_days: config.visitor_days,
            page_days: config.page_days,
        },
        stop_rx,
    ));
    let server = config.server;
    let proxies = config.trusted_proxies.clone();
    let shared = match &config.redis {
        Some(url) => {
            // The URL may hold a password: the error never repeats it.
            let link = state::redis::RedisLink::new(
                url.expose(),
                &config.redis_prefix,
                secret.derive_key("tally redis keys", b""),
            )
            .map_err(|_| {
                anyhow::anyhow!("--redis is not a valid Redis URL (expected redis://host:port/db)")
            })?;
            state::redis::shared(config.state_options(), link)
        }
        None => state::memory::shared(config.state_options()),
    };
    let state::SharedState {
        live,
        limits,
        repeats,
        sites,
        redis,
    } = shared;
    // Reports: only with --smtp; a relay the transport cannot be built for stops the start.
    let reports = match &config.mail {
        Some(mail) => {
            let reporter = ops::report::Reporter {
                store: store.clone(),
                mailer: ops::report::mail::Mailer::new(mail)?,
                clock: Arc::clone(&clock),
                metrics: Arc::clone(&metrics),
                holder: collect::secrets::random_bytes::<8>()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            };
            tracing::info!(relay = reporter.mailer.relay(), "email reports on");
            Some(tokio::spawn(ops::report::report_loop(
                reporter,
                config.report_interval,
                stop_tx.subscribe(),
            )))
        }
        None => None,
    };
    // The location database is read whole at the start: a missing or foreign file stops it.
    let dims = {
        let path = config.geoip.clone();
        tokio::task::spawn_blocking(move || collect::dims::Dimensions::new(path.as_deref()))
            .await??
    };
    let dims = Arc::new(dims);
    let geo_refresh = tokio::spawn(geo_loop(Arc::clone(&dims), stop_tx.subscribe()));
    let collect = Arc::new(Collector::new(
        CollectParts {
            sites: Arc::new(SiteRegistry::new(
                store.clone(),
                sites,
                config.auto_sites,
                config.max_sites,
                Arc::clone(&limits),
            )),
            hasher: SourceHasher::new(store.clone(), secret.clone()),
            ingest,
            clock,
            metrics: Arc::clone(&metrics),
            live,
            limits: Arc::clone(&limits),
            repeats,
            dims,
        },
        config.collect_options(),
    ));
    let auth = Arc::new(Auth::new(&config.auth_options(), &secret, limits));
    let not_counted = Arc::clone(&collect.not_counted);
    // The router owns the only handle on the collector (and so on the ingest queue's sender):
    // once the server loop drops it, the writer drains and stops.
    let state = AppState::new(
        collect,
        Arc::clone(&store),
        auth,
        config.edge_options(),
        redis,
    );
    // Logouts taken before this start, or by another collector of the database.
    if let Err(e) = learn_logouts(store.as_ref(), &state.auth).await {
        tracing::warn!(error = %e, "reading the last admin logout failed; will retry");
    }
    let sessions = tokio::spawn(session_loop(
        store.clone(),
        Arc::clone(&state.auth),
        stop_tx.subscribe(),
    ));
    let flusher = {
        let (tally, store, stop) = (Arc::clone(&not_counted), store.clone(), stop_tx.subscribe());
        tokio::spawn(async move { tally.flush_loop(store, stop).await })
    };
    // Serves until `shutdown`, then within the grace period; handlers get the peer address as
    // `ConnectInfo<SocketAddr>` from the server loop.
    edge::serve::serve(
        listener,
        edge::http::app(state),
        server,
        proxies,
        metrics,
        shutdown,
    )
    .await;
    // The router (and with it every queue sender) is dropped now: the writer drains and stops.
    let _ = stop_tx.send(true);
    let _ = pruner.await;
    let _ = flusher.await;
    let _ = sessions.await;
    let _ = geo_refresh.await;
    if let Some(reports) = reports {
        let _ = reports.await;
    }
    // No handler runs any more: the last views not counted go to the store.
    not_counted.flush(store.as_ref()).await;
    writer.await?;
    // Every write is committed: leave the database alone on disk (no WAL to replay or keep).
    if let Err(e) = store.close_log().await {
        tracing::warn!(error = %e, "folding the log into the database at stop failed; the next start replays it");
    }
    Ok(())
}

/// Learn logouts taken by other collectors of the database every [`edge::http::auth::SESSION_REFRESH`].
async fn session_loop(
    store: Arc<dyn SaltStore>,
    auth: Arc<edge::http::auth::Auth>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(edge::http::auth::SESSION_REFRESH) => {}
        }
        if let Err(e) = learn_logouts(store.as_ref(), &auth).await {
            tracing::debug!(error = %e, "reading the last admin logout failed; will retry");
        }
    }
}

/// Read the last admin logout from the store into `auth`.
async fn learn_logouts(
    store: &dyn SaltStore,
    auth: &edge::http::auth::Auth,
) -> Result<(), store::StoreError> {
    auth.learn_logout(store.sessions_not_before().await?);
    Ok(())
}

/// How often the location database's file is checked for a replacement.
const GEO_REFRESH: Duration = Duration::from_secs(30);

/// Pick up a replaced location database (`--geoip`) without a restart.
async fn geo_loop(
    dims: Arc<collect::dims::Dimensions>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    if dims.geo().is_none() {
        return;
    }
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(GEO_REFRESH) => {}
        }
        let dims = Arc::clone(&dims);
        let refreshed = tokio::task::spawn_blocking(move || {
            dims.geo()
                .map(|g| (g.refresh_if_changed(), g.database_description()))
        })
        .await;
        match refreshed {
            Ok(Some((Ok(true), what))) => {
                tracing::info!(database = %what, "location database reloaded")
            }
            Ok(Some((Err(e), _))) => {
                tracing::warn!(error = %e, "the replaced location database is unusable; the loaded one stays")
            }
            _ => {}
        }
    }
}

/// How often finished days are sealed.
const SEAL_EVERY: Duration = Duration::from_secs(600);
/// How often the retention policy is applied.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Seal finished days now and every [`SEAL_EVERY`]; apply the retention policy now and every
/// [`PRUNE_EVERY`] (salts older than two days go too, so it always runs), raw events only
/// after a complete seal pass: a day's segment exists before its raw events go (pruning
/// never reaches a day that could still be unsealed: retention outlives the event window).
async fn upkeep_loop(
    store: Arc<dyn Maintenance>,
    sealer: collect::seal::Sealer,
    clock: Arc<dyn Clock>,
    policy: Retention,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut pruned_at: Option<tokio::time::Instant> = None;
    loop {
        let complete = match sealer.pass(clock.now(), u64::MAX).await {
            Ok(r) => {
                if r.sealed > 0 {
                    tracing::info!(days = r.sealed, "sealed finished days");
                }
                r.complete
            }
            Err(e) => {
                tracing::warn!(error = %e, "sealing finished days failed; will retry");
                false
            }
        };
        if complete {
            match sealer.roll_up(clock.now()).await {
                Ok(0) => {}
                Ok(months) => tracing::info!(months, "rolled up sealed months"),
                Err(e) => tracing::warn!(error = %e, "rolling up sealed months failed; will retry"),
            }
        }
        if pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            let policy = if complete {
                policy
            } else {
                // Raw events of unsealed days stay until a pass seals them.
                Retention {
                    raw_days: 0,
                    ..policy
                }
            };
            match store.prune(policy, clock.now()).await {
                Ok(r) if r == Default::default() => {}
                Ok(r) => tracing::info!(
                    events = r.events,
                    visitor_rows = r.visitor_rows,
                    counter_rows = r.counter_rows,
                    salts = r.salts,
                    "pruned past retention"
                ),
                Err(e) => tracing::warn!(error = %e, "pruning failed; will retry"),
            }
            pruned_at = Some(tokio::time::Instant::now());
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(SEAL_EVERY) => {}
        }
    }
}
