//! Prometheus metrics, owned by the app state (no process-global registry).
//!
//! Every hit that reaches validation ends in exactly one of: `tally_hits_total{status}`
//! (accepted, duplicate, filtered, suppressed), `tally_rejected_total{code}` (4xx) or
//! `tally_refused_total{reason}` (429/503), so nothing disappears unexplained.

use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of a counted hit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: &'static str,
}

/// Label of a filtered or refused hit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Label of a rejected (4xx) request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: &'static str,
}

/// All metrics of one collector.
pub struct Metrics {
    registry: Registry,
    pub hits: Family<StatusLabel, Counter>,
    pub filtered: Family<ReasonLabel, Counter>,
    pub refused: Family<ReasonLabel, Counter>,
    pub rejected: Family<CodeLabel, Counter>,
    pub queue_depth: Gauge<i64, AtomicI64>,
    pub oldest_pending_seconds: Gauge<f64, AtomicU64>,
    pub commit_seconds: Histogram,
    pub batch_records: Histogram,
    /// Free bytes on the database's filesystem (set when `/metrics` renders).
    pub disk_free_bytes: Gauge<i64, AtomicI64>,
    /// 1 when the storage probe passes (file present, disk above its floor), else 0.
    pub storage_up: Gauge<i64, AtomicI64>,
    /// HTTP connections being served now (refused ones not included).
    pub connections_open: Gauge,
    /// Connections answered 503 `too_many_connections` at the connection cap.
    pub connections_refused: Counter,
    /// Connections the server closed on a limit, by reason (`idle_timeout`, `header_timeout`,
    /// `body_timeout`, `shutdown_grace`).
    pub connections_cut: Family<ReasonLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh, registered metrics.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tally");
        let hits = Family::<StatusLabel, Counter>::default();
        registry.register("hits", "Hits by outcome", hits.clone());
        let filtered = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "filtered",
            "Hits filtered before counting, by reason",
            filtered.clone(),
        );
        let refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "refused",
            "Hits refused with 429/503, by reason",
            refused.clone(),
        );
        let rejected = Family::<CodeLabel, Counter>::default();
        registry.register(
            "rejected",
            "Requests rejected with 4xx, by error code",
            rejected.clone(),
        );
        let queue_depth = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "queue_depth",
            "Jobs waiting for the writer",
            queue_depth.clone(),
        );
        let oldest_pending_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "oldest_pending_age_seconds",
            "Age of the oldest job in the batch being committed",
            oldest_pending_seconds.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "commit_duration_seconds",
            "Store commit latency per batch",
            commit_seconds.clone(),
        );
        let batch_records = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "batch_records",
            "Records per committed batch",
            batch_records.clone(),
        );
        let disk_free_bytes = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "disk_free_bytes",
            "Free bytes on the database's filesystem",
            disk_free_bytes.clone(),
        );
        let storage_up = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "storage_up",
            "1 when the storage probe passes (database file present, disk above the floor)",
            storage_up.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "HTTP connections being served",
            connections_open.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Connections refused with 503 at the connection cap",
            connections_refused.clone(),
        );
        let connections_cut = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "connections_cut",
            "Connections closed by the server on a timeout or at the end of the shutdown grace",
            connections_cut.clone(),
        );
        Self {
            registry,
            disk_free_bytes,
            storage_up,
            hits,
            filtered,
            refused,
            rejected,
            queue_depth,
            oldest_pending_seconds,
            commit_seconds,
            batch_records,
            connections_open,
            connections_refused,
            connections_cut,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Count a hit outcome.
    pub fn hit(&self, status: &'static str) {
        self.hits.get_or_create(&StatusLabel { status }).inc();
    }
}
