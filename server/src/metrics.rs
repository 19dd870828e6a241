//! Prometheus metrics, owned by the app state (no process-global registry).
//!
//! Every hit that reaches validation ends in exactly one of: `tally_hits_total{status}`
//! (accepted, duplicate, filtered, suppressed), `tally_rejected_total{code}` (4xx) or
//! `tally_refused_total{reason}` (429/503), so nothing disappears unexplained.
//!
//! Contract: two encodings of the same registry — [`Metrics::render_openmetrics`]
//! (OpenMetrics 1.0, what `prometheus-client` writes) and [`Metrics::render_classic`] (the
//! Prometheus text format 0.0.4, the default of `/metrics`). Every family has `HELP` and
//! `TYPE`, and every label value listed in [`HIT_STATUSES`], [`FILTER_REASONS`],
//! [`REFUSE_REASONS`], [`REJECT_CODES`] and [`READ_CACHES`] is present (at 0) from the start,
//! so a rate over a series that has not happened yet is 0, not absent.

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

/// Label of a read cache's bytes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    pub cache: &'static str,
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
    /// With `--redis`: 1 while Redis does not answer and the shared state falls back to this
    /// process (0 when it answers, and without `--redis`).
    pub redis_fallback_active: Gauge<i64, AtomicI64>,
    /// With `--redis`: operations answered by the in-process fallback.
    pub redis_fallbacks: Counter,
    /// Stats requests answered by an identical request's read (`http::coalesce`).
    pub stats_coalesced: Counter,
    /// HTTP connections being served now (refused ones not included).
    pub connections_open: Gauge,
    /// Connections answered 503 `too_many_connections` at the connection cap.
    pub connections_refused: Family<ReasonLabel, Counter>,
    pub requests_refused: Counter,
    /// Bytes the reads keep in memory, by cache ([`READ_CACHES`]; set when `/metrics`
    /// renders, estimated where a cache counts entries).
    pub read_cache_bytes: Family<CacheLabel, Gauge<i64, AtomicI64>>,
    /// Connections the server closed on a limit, by reason (`idle_timeout`, `header_timeout`,
    /// `body_timeout`, `shutdown_grace`).
    pub connections_cut: Family<ReasonLabel, Counter>,
    /// Views not counted that could not be added to their site's tally (the tally was full
    /// between two flushes); they are still in `tally_filtered_total`.
    pub filtered_untallied: Counter,
    /// Passes of the report task over the schedules (it is alive while this grows).
    pub report_checks: Counter,
    /// Scheduled email reports sent by this process.
    pub reports_sent: Counter,
    /// Email report sends that failed (each failed attempt once).
    pub report_failures: Counter,
    /// Scheduled report sends that failed and wait for their next try (as of the last pass).
    pub reports_retry_waiting: Gauge<i64, AtomicI64>,
}

/// Caches the reads keep, as labelled in `tally_read_cache_bytes`: the analytics' kept
/// segment parts, question states and dictionaries (`--analytics-cache-mb` holds the first two
/// together), the v1 reads' kept per-day visitor sets and page rows, and the visitor numbers
/// the analytics looked up for open days.
pub const READ_CACHES: [&str; 6] = [
    "segments",
    "states",
    "dictionaries",
    "day_sets",
    "day_pages",
    "visitor_numbers",
];

/// Every `status` of `tally_hits_total`.
pub const HIT_STATUSES: [&str; 4] = ["accepted", "duplicate", "filtered", "suppressed"];

/// Every `reason` of `tally_filtered_total`.
pub const FILTER_REASONS: [&str; 3] = ["bot", "empty_user_agent", "rate_limited"];

/// Every `reason` of `tally_refused_total` (the codes of 429 and 503 answers).
pub const REFUSE_REASONS: [&str; 5] = [
    "rate_limited",
    "overloaded",
    "storage_unavailable",
    "disk_full",
    "busy",
];

/// The known `code`s of `tally_rejected_total` (4xx answers of the counting endpoints);
/// other codes still appear once they happen.
pub const REJECT_CODES: [&str; 21] = [
    "malformed_json",
    "invalid_field",
    "invalid_type",
    "invalid_site",
    "invalid_event_id",
    "invalid_visitor_id",
    "invalid_url",
    "invalid_referrer",
    "invalid_name",
    "invalid_dedupe",
    "event_id_out_of_window",
    "empty_body",
    "batch_over_allowance",
    "unauthorized",
    "invalid_ingest_key",
    "unknown_site",
    "origin_not_allowed",
    "site_limit_reached",
    "body_too_large",
    "unsupported_media_type",
    "method_not_allowed",
];

/// Content type of the classic text format.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Content type of OpenMetrics 1.0.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
            "Time from a batch's start to its durable commit (the wait its senders see)",
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
        let redis_fallback_active = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "redis_fallback_active",
            "1 while Redis (--redis) does not answer and live numbers, limits, repeat gate and site cache fall back to this process",
            redis_fallback_active.clone(),
        );
        let redis_fallbacks = Counter::default();
        registry.register(
            "redis_fallbacks",
            "With --redis: operations answered by the in-process fallback because Redis failed",
            redis_fallbacks.clone(),
        );
        let stats_coalesced = Counter::default();
        registry.register(
            "stats_coalesced",
            "Stats requests (dashboard, v1 reads, query API) answered by an identical request's read they waited with",
            stats_coalesced.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "connections_open",
            "HTTP connections being served",
            connections_open.clone(),
        );
        let connections_refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections refused with 503: at the connection cap (reason cap) or past their address's share (address_share)",
            connections_refused.clone(),
        );
        let read_cache_bytes = Family::<CacheLabel, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "read_cache_bytes",
            "Bytes the reads keep in memory, by cache (estimated where a cache counts entries)",
            read_cache_bytes.clone(),
        );
        let requests_refused = Counter::default();
        registry.register(
            "requests_refused",
            "Requests answered 503 because their address held its whole share of open requests",
            requests_refused.clone(),
        );
        let filtered_untallied = Counter::default();
        registry.register(
            "filtered_untallied",
            "Views not counted that were missing from their site's tally (tally full until its next flush)",
            filtered_untallied.clone(),
        );
        let report_checks = Counter::default();
        registry.register(
            "report_checks",
            "Passes of the email report task over the schedules (with --smtp)",
            report_checks.clone(),
        );
        let reports_sent = Counter::default();
        registry.register(
            "reports_sent",
            "Email reports sent by this collector",
            reports_sent.clone(),
        );
        let report_failures = Counter::default();
        registry.register(
            "report_failures",
            "Email report send attempts that failed (retried with backoff)",
            report_failures.clone(),
        );
        let reports_retry_waiting = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "reports_retry_waiting",
            "Scheduled email reports that failed and wait for a retry",
            reports_retry_waiting.clone(),
        );
        let connections_cut = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "connections_cut",
            "Connections closed by the server on a timeout or at the end of the shutdown grace",
            connections_cut.clone(),
        );
        for reason in ["cap", "address_share"] {
            drop(connections_refused.get_or_create(&ReasonLabel { reason }));
        }
        for cache in READ_CACHES {
            drop(read_cache_bytes.get_or_create(&CacheLabel { cache }));
        }
        for status in HIT_STATUSES {
            drop(hits.get_or_create(&StatusLabel { status }));
        }
        for reason in FILTER_REASONS {
            drop(filtered.get_or_create(&ReasonLabel { reason }));
        }
        for reason in REFUSE_REASONS {
            drop(refused.get_or_create(&ReasonLabel { reason }));
        }
        for code in REJECT_CODES {
            drop(rejected.get_or_create(&CodeLabel { code }));
        }
        Self {
            registry,
            disk_free_bytes,
            storage_up,
            redis_fallback_active,
            redis_fallbacks,
            stats_coalesced,
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
            read_cache_bytes,
            requests_refused,
            connections_cut,
            filtered_untallied,
            report_checks,
            reports_sent,
            report_failures,
            reports_retry_waiting,
        }
    }

    /// OpenMetrics 1.0 text (ends with `# EOF`).
    pub fn render_openmetrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The classic Prometheus text format 0.0.4.
    pub fn render_classic(&self) -> String {
        openmetrics_to_classic(&self.render_openmetrics())
    }

    /// Count a hit outcome.
    pub fn hit(&self, status: &'static str) {
        self.hits.get_or_create(&StatusLabel { status }).inc();
    }
}

/// Convert `prometheus-client`'s OpenMetrics text to the classic format 0.0.4.
///
/// The two differ, for what this registry holds, in three places: an OpenMetrics counter
/// family is named without `_total` while its samples carry it (classic: the family is named
/// like its samples, `tally_hits_total`); `# UNIT` lines and the `# EOF` terminator do not
/// exist in 0.0.4; and OpenMetrics may add `_created` samples (classic has none). Gauges and
/// histograms (`_bucket`, `_sum`, `_count`) are written the same in both. Help texts here hold
/// no `"`, whose escaping differs.
pub fn openmetrics_to_classic(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line
            .strip_prefix("# HELP ")
            .map(|r| ("# HELP ", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)))
        {
            let (kind, rest) = rest;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(kind);
            out.push_str(name);
            if counters.contains(name) {
                out.push_str("_total");
            }
            out.push(' ');
            out.push_str(tail);
            out.push('\n');
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if name
            .strip_suffix("_created")
            .is_some_and(|base| counters.contains(base))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_names_counter_families_with_total_and_drops_eof() {
        let m = Metrics::new();
        m.hit("accepted");
        let text = m.render_classic();
        assert!(
            text.contains("# HELP tally_hits_total Hits by outcome."),
            "{text}"
        );
        assert!(text.contains("# TYPE tally_hits_total counter"), "{text}");
        assert!(
            text.contains("tally_hits_total{status=\"accepted\"} 1"),
            "{text}"
        );
        assert!(text.contains("# TYPE tally_queue_depth gauge"), "{text}");
        assert!(
            text.contains("tally_commit_duration_seconds_bucket{le=\"+Inf\"} 0"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
        let open = m.render_openmetrics();
        assert!(open.contains("# TYPE tally_hits counter") && open.ends_with("# EOF\n"));
    }

    #[test]
    fn known_label_values_are_present_from_the_start() {
        let text = Metrics::new().render_classic();
        for status in HIT_STATUSES {
            assert!(text.contains(&format!("tally_hits_total{{status=\"{status}\"}} 0")));
        }
        for reason in FILTER_REASONS {
            assert!(text.contains(&format!("tally_filtered_total{{reason=\"{reason}\"}} 0")));
        }
        for reason in REFUSE_REASONS {
            assert!(text.contains(&format!("tally_refused_total{{reason=\"{reason}\"}} 0")));
        }
        for code in REJECT_CODES {
            assert!(text.contains(&format!("tally_rejected_total{{code=\"{code}\"}} 0")));
        }
        for cache in READ_CACHES {
            assert!(text.contains(&format!("tally_read_cache_bytes{{cache=\"{cache}\"}} 0")));
        }
    }
}
