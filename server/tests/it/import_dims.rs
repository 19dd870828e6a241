//! Imports carry the dimensions: access logs classified like live hits (user agent, referrer,
//! campaign tags, `--geoip`) and GoatCounter's columns, answered by the analytics; a day
//! pruned before a later import keeps its breakdowns. Plausible's breakdowns and the export
//! are `import_plausible`. Every test runs the real CLI on SQLite and on PostgreSQL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jiff::civil::{Date, date};
use tally::core::day::SiteZone;
use tally::core::query::{Dimension, Filter, Metric, Op, Query, Value, VisitDim};
use tally::store::Store;
use tally::store::analytics::Analytics;
use tally::store::merge::Imports;

use crate::import::{Backend, Db, blog, on_both, sample};

const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, \
    like Gecko) Chrome/131.0.0.0 Safari/537.36";
const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 18_3 like Mac OS X) \
    AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.3 Mobile/15E148 Safari/604.1";
const IPAD: &str = "Mozilla/5.0 (iPad; CPU OS 17_4 like Mac OS X) AppleWebKit/605.1.15 \
    (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1";
const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:135.0) Gecko/20100101 Firefox/135.0";
const BOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

/// A small location database: 198.51.100.0/24 in France, 203.0.113.0/24 in Japan (Tokyo).
fn location_db(dir: &Path) -> PathBuf {
    use mmdb_writer::{IpVersion, Ipv4Aliasing, Value as Mmdb, Writer};
    let mut w = Writer::builder("GeoIP2-City")
        .ip_version(IpVersion::V6)
        .ipv4_aliasing(Ipv4Aliasing::Disabled)
        .build();
    for (net, cc, sub) in [
        ("198.51.100.0/24", "FR", None),
        ("203.0.113.0/24", "JP", Some("13")),
    ] {
        let net: ipnet::IpNet = net.parse().expect("net");
        let mut fields = vec![("country", Mmdb::map([("iso_code", Mmdb::from(cc))]))];
        if let Some(sub) = sub {
            fields.push((
                "subdivisions",
                Mmdb::array([Mmdb::map([("iso_code", Mmdb::from(sub))])]),
            ));
        }
        w.insert_value(net, Mmdb::map(fields)).expect("insert");
    }
    let path = dir.join("geo.mmdb");
    std::fs::write(&path, w.to_bytes().expect("db")).expect("write");
    path
}

/// One combined log line.
fn line(ip: &str, at: &str, path: &str, referrer: &str, agent: &str) -> String {
    format!("{ip} - - [{at} +0000] \"GET {path} HTTP/1.1\" 200 512 \"{referrer}\" \"{agent}\"\n")
}

pub(crate) fn question(
    metrics: &[Metric],
    dimensions: &[Dimension],
    filters: Vec<Filter>,
) -> Query {
    Query {
        metrics: metrics.to_vec(),
        dimensions: dimensions.to_vec(),
        filters,
        order_by: Vec::new(),
        limit: 1000,
        offset: 0,
    }
}

pub(crate) fn is(dimension: Dimension, value: &str) -> Filter {
    Filter {
        dimension,
        op: Op::Is,
        values: vec![value.to_owned()],
        case_sensitive: true,
    }
}

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(n) => *n,
        Value::Float(x) => x.round() as u64,
        Value::Null => u64::MAX,
    }
}

/// What the analytics answer: each row's dimension values and metrics as integers.
pub(crate) async fn ask(
    store: &Arc<dyn Store>,
    (from, to): (Date, Date),
    q: Query,
    imports: bool,
) -> (Vec<(Vec<String>, Vec<u64>)>, Imports) {
    let analytics = Analytics::new(store.clone(), 1 << 20);
    let mut answers = analytics
        .answer_with(&blog(), &SiteZone::utc(), from, to, &[q], imports)
        .await
        .expect("answers");
    let (answer, said) = answers.remove(0);
    let rows = answer
        .rows
        .iter()
        .map(|r| (r.dimensions.clone(), r.metrics.iter().map(int).collect()))
        .collect();
    (rows, said)
}

/// Visitors per value of one visit dimension.
pub(crate) async fn visitors_by(
    store: &Arc<dyn Store>,
    range: (Date, Date),
    dim: VisitDim,
) -> Vec<(String, u64)> {
    let (rows, _) = ask(
        store,
        range,
        question(&[Metric::Visitors], &[Dimension::Visit(dim)], Vec::new()),
        true,
    )
    .await;
    let mut out: Vec<(String, u64)> = rows
        .into_iter()
        .map(|(d, m)| (d[0].clone(), m[0]))
        .collect();
    out.sort();
    out
}

pub(crate) fn pairs(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = list.iter().map(|(v, n)| ((*v).to_owned(), *n)).collect();
    out.sort();
    out
}

// Four visitors over two days: one day past the retention (sealed into a segment) and one
// two days ago (still open: read from its raw events).
on_both!(combined_log_lines_get_the_dimensions_of_live_hits);
async fn combined_log_lines_get_the_dimensions_of_live_hits(db: Db) {
    let recent = jiff::Timestamp::now()
        .to_zoned(jiff::tz::TimeZone::UTC)
        .date()
        .checked_sub(jiff::Span::new().days(2))
        .expect("a day");
    let at = |day: Date, time: &str| format!("{}:{time}", day.strftime("%d/%b/%Y"));
    let old = date(2025, 3, 2);
    let log = [
        line(
            "198.51.100.7",
            &at(old, "08:00:00"),
            "/?utm_source=newsletter&utm_medium=email&utm_campaign=spring",
            "-",
            CHROME,
        ),
        // Internal navigation: the visit keeps its source.
        line(
            "198.51.100.7",
            &at(old, "08:01:00"),
            "/pricing",
            "https://blog.example/?utm_source=newsletter",
            CHROME,
        ),
        line(
            "203.0.113.5",
            &at(old, "09:00:00"),
            "/posts/a",
            "https://news.ycombinator.com/item?id=1",
            IPHONE,
        ),
        line(
            "10.0.0.1",
            &at(old, "10:00:00"),
            "/?gclid=abc",
            "https://www.google.com/",
            FIREFOX,
        ),
        line("66.249.66.1", &at(old, "10:30:00"), "/", "-", BOT),
        line(
            "198.51.100.9",
            &at(recent, "12:00:00"),
            "/?ref=producthunt",
            "-",
            IPAD,
        ),
    ]
    .concat();
    let file = db.dir.join("dims.log");
    std::fs::write(&file, log).expect("write");
    let geo = location_db(&db.dir);
    let geo = geo.to_str().expect("utf-8");
    let out = db.import("combined", &file, &["--geoip", geo]).await;
    assert!(
        out.contains("imported 5, duplicates 0, rejected 1"),
        "{out}"
    );
    assert!(out.contains("sealed "), "the old day is sealed: {out}");
    db.verify_clean().await;
    let store = db.store().await;
    let range = (old, recent);
    let expect = [
        (
            VisitDim::Browser,
            pairs(&[("Safari", 2), ("Chrome", 1), ("Firefox", 1)]),
        ),
        (
            VisitDim::Device,
            pairs(&[("Desktop", 2), ("Mobile", 1), ("Tablet", 1)]),
        ),
        (
            VisitDim::Os,
            pairs(&[("iOS", 2), ("Windows", 1), ("Linux", 1)]),
        ),
        (
            VisitDim::Source,
            pairs(&[
                ("newsletter", 1),
                ("Hacker News", 1),
                ("Google", 1),
                ("Product Hunt", 1),
            ]),
        ),
        (
            VisitDim::Channel,
            pairs(&[("Email", 1), ("Organic Social", 2), ("Paid Search", 1)]),
        ),
        (
            VisitDim::UtmCampaign,
            pairs(&[("spring", 1), ("(not set)", 3)]),
        ),
        (
            VisitDim::UtmMedium,
            pairs(&[("email", 1), ("(gclid)", 1), ("(not set)", 2)]),
        ),
        (
            VisitDim::Referrer,
            pairs(&[
                ("news.ycombinator.com/item", 1),
                ("google.com", 1),
                ("Direct / None", 2),
            ]),
        ),
        (
            VisitDim::Country,
            pairs(&[("FR", 2), ("JP", 1), ("(not set)", 1)]),
        ),
        (VisitDim::Region, pairs(&[("JP-13", 1), ("(not set)", 3)])),
    ];
    for (dim, want) in &expect {
        assert_eq!(&visitors_by(&store, range, *dim).await, want, "{dim:?}");
    }
    // One visit of two pages, three of one: 75 % bounce; no query string kept anywhere.
    let (rows, _) = ask(
        &store,
        range,
        question(
            &[Metric::Visits, Metric::Pageviews, Metric::BounceRate],
            &[],
            Vec::new(),
        ),
        false,
    )
    .await;
    assert_eq!(rows[0].1, [4, 5, 75]);
    let (pages, _) = ask(
        &store,
        range,
        question(&[Metric::Visitors], &[Dimension::Page], Vec::new()),
        false,
    )
    .await;
    assert!(pages.iter().all(|(d, _)| !d[0].contains('?')), "{pages:?}");
    // Raw events keep no query string (and no internal referrer).
    let events = db.export(&["--what", "events"]).await;
    assert_eq!(events.lines().count(), 6, "{events}");
    assert!(
        !events.contains('?') && !events.contains("blog.example"),
        "{events}"
    );

    let again = db.import("combined", &file, &["--geoip", geo]).await;
    assert!(
        again.contains("imported 0, duplicates 5, rejected 1"),
        "{again}"
    );
    for (dim, want) in &expect {
        assert_eq!(
            &visitors_by(&store, range, *dim).await,
            want,
            "{dim:?} after a re-run"
        );
    }
    db.verify_clean().await;
    // Without a location database, countries are unknown.
    let other = Db::on(db.backend()).await.expect("same backend");
    other.import("combined", &file, &[]).await;
    assert_eq!(
        visitors_by(&other.store().await, range, VisitDim::Country).await,
        pairs(&[("(not set)", 4)])
    );
}

// GoatCounter's columns: Browser, System, Screen size, Location, Referrer and its scheme, and
// a Campaign column; the last row states nothing.
on_both!(goatcounter_columns_become_the_breakdowns);
async fn goatcounter_columns_become_the_breakdowns(db: Db) {
    let out = db
        .import("goatcounter", &sample("goatcounter-dims.csv"), &[])
        .await;
    assert!(
        out.contains("imported 5, duplicates 0, rejected 0"),
        "{out}"
    );
    db.verify_clean().await;
    let store = db.store().await;
    let day = (date(2025, 3, 2), date(2025, 3, 2));
    let expect = [
        (
            VisitDim::Browser,
            pairs(&[
                ("Chrome", 1),
                ("Safari", 1),
                ("Firefox", 1),
                ("(not set)", 1),
            ]),
        ),
        (
            VisitDim::BrowserVersion,
            pairs(&[("131", 1), ("18", 1), ("135", 1), ("(not set)", 1)]),
        ),
        (
            VisitDim::Os,
            pairs(&[("Windows", 1), ("iOS", 1), ("Linux", 1), ("(not set)", 1)]),
        ),
        (
            VisitDim::OsVersion,
            pairs(&[("10", 1), ("18", 1), ("(not set)", 2)]),
        ),
        (
            VisitDim::Device,
            pairs(&[
                ("Desktop", 1),
                ("Mobile", 1),
                ("Laptop", 1),
                ("(not set)", 1),
            ]),
        ),
        (
            VisitDim::Country,
            pairs(&[("US", 1), ("NL", 1), ("DE", 1), ("(not set)", 1)]),
        ),
        (
            VisitDim::Region,
            pairs(&[("US-CA", 1), ("DE-BE", 1), ("(not set)", 2)]),
        ),
        (
            VisitDim::Source,
            pairs(&[
                ("news.example.net", 1),
                ("Hacker News", 1),
                ("newsletter", 1),
                ("Direct / None", 1),
            ]),
        ),
        (
            VisitDim::Channel,
            pairs(&[
                ("Referral", 1),
                ("Organic Social", 1),
                ("Email", 1),
                ("Direct", 1),
            ]),
        ),
        (
            VisitDim::Referrer,
            pairs(&[("news.example.net/item", 1), ("Direct / None", 3)]),
        ),
        (
            VisitDim::UtmCampaign,
            pairs(&[("spring", 1), ("(not set)", 3)]),
        ),
        (VisitDim::UtmSource, pairs(&[("(not set)", 4)])),
    ];
    for (dim, want) in &expect {
        assert_eq!(&visitors_by(&store, day, *dim).await, want, "{dim:?}");
    }
    // Events are no imported aggregates: asking for imports changes nothing, says nothing.
    let (_, said) = ask(
        &store,
        day,
        question(&[Metric::Visitors], &[], Vec::new()),
        true,
    )
    .await;
    assert_eq!(said, Imports::default());
    let again = db
        .import("goatcounter", &sample("goatcounter-dims.csv"), &[])
        .await;
    assert!(again.contains("imported 0, duplicates 5"), "{again}");
    assert_eq!(
        visitors_by(&store, day, VisitDim::Browser).await,
        expect[0].1
    );
    db.verify_clean().await;
}

// A day whose raw events retention removed keeps its sealed breakdowns when another import
// adds to it (they could not be rebuilt whole); the added lines are counted. Retention waits
// while an import holds its lease.
on_both!(a_pruned_day_keeps_its_breakdowns_and_retention_waits_for_imports);
async fn a_pruned_day_keeps_its_breakdowns_and_retention_waits_for_imports(db: Db) {
    db.import("goatcounter", &sample("goatcounter-dims.csv"), &[])
        .await;
    let store = db.store().await;
    let policy = tally::store::Retention {
        raw_days: 400,
        ..Default::default()
    };
    let now = jiff::Timestamp::now();
    let r = store.prune(policy, now).await.expect("prune");
    assert_eq!(r.events, 0, "the import's lease holds retention");
    let later = now + jiff::SignedDuration::from_hours(1);
    let r = store.prune(policy, later).await.expect("prune");
    assert_eq!(
        r.events, 5,
        "after the lease, raw events past the retention go"
    );
    let day = (date(2025, 3, 2), date(2025, 3, 2));
    let before = visitors_by(&store, day, VisitDim::Browser).await;
    assert_eq!(before.len(), 4, "{before:?}");
    let out = db.import("combined", &sample("access.log"), &[]).await;
    assert!(out.contains("imported 4"), "{out}");
    assert_eq!(visitors_by(&store, day, VisitDim::Browser).await, before);
    let c = store
        .counts(
            &blog(),
            &tally::core::ids::PagePath::root(),
            date(2025, 3, 2),
        )
        .await
        .expect("counts");
    assert_eq!(c.site_today.web.views, 5 + 3, "counted all the same");
    db.verify_clean().await;
}
