//! Plausible's daily breakdowns: kept per table, day and value, merged into the answers that
//! ask for imports (the store's analytics and `POST /api/v2/query`), and `tally export --what
//! breakdowns|visits` equal to what the analytics answer. Every test runs the real CLI on
//! SQLite and on PostgreSQL.

use std::path::Path;
use std::process::Stdio;

use jiff::civil::{Date, date};
use serde_json::{Value as Json, json};
use tally::core::day::SiteZone;
use tally::core::query::{Dimension, Grain, Metric, Value, VisitDim};
use tally::store::analytics::Analytics;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::import::{Backend, Db, blog, on_both, sample};
use crate::import_dims::{ask, is, pairs, question, visitors_by};

/// A zip of Plausible's CSV files, `(name, text)`.
fn zip_of(path: &Path, files: &[(&str, &str)]) {
    use std::io::Write as _;
    let file = std::fs::File::create(path).expect("create");
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default();
    for (name, text) in files {
        zip.start_file(*name, options).expect("entry");
        zip.write_all(text.as_bytes()).expect("write");
    }
    zip.finish().expect("finish");
}

/// Plausible's export of two days, every table (sources without a channel column; two cities
/// of one region; a custom event with two link URLs).
fn plausible_export(path: &Path) {
    zip_of(
        path,
        &[
            (
                "imported_visitors_20241101_20241102.csv",
                "date,visitors,pageviews,bounces,visits,visit_duration\n\
                 2024-11-01,130,178,80,150,21000\n\
                 2024-11-02,95,122,60,110,15000\n",
            ),
            (
                "imported_sources_20241101_20241102.csv",
                "date,source,referrer,utm_source,utm_medium,utm_campaign,utm_content,utm_term,\
                 pageviews,visitors,visits,visit_duration,bounces\n\
                 2024-11-01,Google,https://www.google.com/,,,,,,50,40,45,3000,20\n\
                 2024-11-01,,,,,,,,128,90,105,18000,60\n\
                 2024-11-02,Newsletter,,newsletter,email,autumn,,,22,20,20,1000,10\n\
                 2024-11-02,,,,,,,,100,75,90,14000,50\n",
            ),
            (
                "imported_pages_20241101_20241102.csv",
                "date,hostname,page,visits,visitors,pageviews\n\
                 2024-11-01,blog.example,/,120,98,131\n\
                 2024-11-01,blog.example,/pricing,40,37,47\n\
                 2024-11-02,blog.example,/,101,87,122\n",
            ),
            (
                "imported_entry_pages_20241101_20241102.csv",
                "date,entry_page,visitors,entrances,visit_duration,bounces,pageviews\n\
                 2024-11-01,/,100,110,15000,60,140\n\
                 2024-11-01,/pricing,35,40,6000,20,38\n\
                 2024-11-02,/,95,110,15000,60,122\n",
            ),
            (
                "imported_exit_pages_20241101_20241102.csv",
                "date,exit_page,visitors,visit_duration,exits,bounces,pageviews\n\
                 2024-11-01,/pricing,60,9000,70,30,90\n",
            ),
            (
                "imported_locations_20241101_20241102.csv",
                "date,country,region,city,visitors,visits,visit_duration,bounces,pageviews\n\
                 2024-11-01,DE,DE-BE,2950159,30,35,5000,20,40\n\
                 2024-11-01,DE,DE-BE,2950160,10,10,1000,5,12\n\
                 2024-11-01,US,US-CA,5391959,90,105,15000,55,126\n",
            ),
            (
                "imported_devices_20241101_20241102.csv",
                "date,device,visitors,visits,visit_duration,bounces,pageviews\n\
                 2024-11-01,Desktop,100,120,18000,60,140\n\
                 2024-11-01,Mobile,30,30,3000,20,38\n",
            ),
            (
                "imported_browsers_20241101_20241102.csv",
                "date,browser,browser_version,visitors,visits,visit_duration,bounces,pageviews\n\
                 2024-11-01,Chrome,131.0,80,95,14000,50,110\n\
                 2024-11-01,Firefox,133.0,50,55,7000,30,68\n\
                 2024-11-02,Chrome,131.0,60,70,9000,40,80\n",
            ),
            (
                "imported_operating_systems_20241101_20241102.csv",
                "date,operating_system,operating_system_version,visitors,visits,visit_duration,\
                 bounces,pageviews\n\
                 2024-11-01,Mac,14.2,70,80,11000,40,95\n\
                 2024-11-01,GNU/Linux,,60,70,10000,40,83\n",
            ),
            (
                "imported_custom_events_20241101_20241102.csv",
                "date,name,link_url,path,visitors,events\n\
                 2024-11-01,Outbound Link: Click,https://a.example/,,5,6\n\
                 2024-11-01,Outbound Link: Click,https://b.example/,,3,3\n\
                 2024-11-02,signup,,,4,4\n",
            ),
        ],
    );
}

const NOV: (Date, Date) = (date(2024, 11, 1), date(2024, 11, 2));

on_both!(plausible_breakdowns_are_answered_where_imports_are_asked);
async fn plausible_breakdowns_are_answered_where_imports_are_asked(db: Db) {
    let file = db.dir.join("plausible.zip");
    plausible_export(&file);
    let out = db.import("plausible", &file, &[]).await;
    assert!(
        out.contains("read 26 lines") && out.contains("imported 26, duplicates 0, rejected 0"),
        "{out}"
    );
    db.verify_clean().await;
    let store = db.store().await;
    let totals = question(
        &[
            Metric::Visitors,
            Metric::Visits,
            Metric::Pageviews,
            Metric::BounceRate,
            Metric::VisitDuration,
        ],
        &[],
        Vec::new(),
    );
    // Visitors of the two days are summed: 130 + 95.
    let (rows, said) = ask(&store, NOV, totals.clone(), true).await;
    assert_eq!(rows[0].1, [225, 260, 300, 54, 138]);
    assert!(said.included);
    assert!(
        said.warning.as_deref().is_some_and(|w| w.contains("sums")),
        "{said:?}"
    );
    let (rows, said) = ask(&store, NOV, totals.clone(), false).await;
    assert_eq!((rows[0].1[0], said.included), (0, false), "only when asked");
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::Browser).await,
        pairs(&[("Chrome", 140), ("Firefox", 50)])
    );
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::BrowserVersion).await,
        pairs(&[("131", 140), ("133", 50)])
    );
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::Os).await,
        pairs(&[("macOS", 70), ("Linux", 60)])
    );
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::Region).await,
        pairs(&[("DE-BE", 40), ("US-CA", 90)])
    );
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::Channel).await,
        pairs(&[("Direct", 165), ("Email", 20), ("Organic Search", 40)])
    );
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::Referrer).await,
        pairs(&[("google.com", 40), ("Direct / None", 185)])
    );
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::UtmCampaign).await,
        pairs(&[("autumn", 20), ("(not set)", 205)])
    );
    // Per day, and filtered on the dimension broken down by.
    let (rows, said) = ask(
        &store,
        NOV,
        question(
            &[Metric::Visitors, Metric::Visits, Metric::BounceRate],
            &[
                Dimension::Time(Grain::Day),
                Dimension::Visit(VisitDim::Browser),
            ],
            vec![is(Dimension::Visit(VisitDim::Browser), "Chrome")],
        ),
        true,
    )
    .await;
    assert!(said.included);
    assert_eq!(
        rows,
        vec![
            (vec!["2024-11-01".into(), "Chrome".into()], vec![80, 95, 53]),
            (vec!["2024-11-02".into(), "Chrome".into()], vec![60, 70, 57]),
        ]
    );
    // Pages: visitors and views from the pages, bounces and durations of the visits that
    // entered there.
    let (rows, _) = ask(
        &store,
        NOV,
        question(
            &[
                Metric::Visitors,
                Metric::Pageviews,
                Metric::BounceRate,
                Metric::VisitDuration,
            ],
            &[Dimension::Page],
            Vec::new(),
        ),
        true,
    )
    .await;
    assert_eq!(
        rows,
        vec![
            (vec!["/".into()], vec![185, 253, 55, 136]),
            (vec!["/pricing".into()], vec![37, 47, 50, 150]),
        ]
    );
    let (rows, _) = ask(
        &store,
        NOV,
        question(
            &[Metric::Visitors, Metric::Events],
            &[Dimension::Name],
            Vec::new(),
        ),
        true,
    )
    .await;
    assert_eq!(
        rows,
        vec![
            (vec!["pageview".into()], vec![225, 300]),
            (vec!["Outbound Link: Click".into()], vec![8, 9]),
            (vec!["signup".into()], vec![4, 4]),
        ]
    );
    // Not answerable from one imported table: the counted events alone, and why.
    for q in [
        question(
            &[Metric::Visitors],
            &[Dimension::Visit(VisitDim::Browser)],
            vec![is(Dimension::Visit(VisitDim::Country), "DE")],
        ),
        question(
            &[Metric::Visitors],
            &[Dimension::Time(Grain::Hour)],
            Vec::new(),
        ),
    ] {
        let (rows, said) = ask(&store, NOV, q, true).await;
        assert!(rows.iter().all(|(_, m)| m[0] == 0), "{rows:?}");
        assert!(!said.included);
        assert!(
            said.warning
                .as_deref()
                .is_some_and(|w| w.contains("not included")),
            "{said:?}"
        );
    }
    // A re-run replaces what it wrote: the same numbers.
    let again = db.import("plausible", &file, &[]).await;
    assert!(again.contains("imported 26"), "{again}");
    let (rows, _) = ask(&store, NOV, totals, true).await;
    assert_eq!(rows[0].1, [225, 260, 300, 54, 138]);
    assert_eq!(
        visitors_by(&store, NOV, VisitDim::Region).await,
        pairs(&[("DE-BE", 40), ("US-CA", 90)])
    );
    db.verify_clean().await;

    // An older export (pages, sources and daily totals only) answers what it has.
    let older = Db::on(db.backend()).await.expect("same backend");
    older
        .import("plausible", &sample("plausible.zip"), &[])
        .await;
    let older_store = older.store().await;
    assert_eq!(
        visitors_by(&older_store, NOV, VisitDim::Source).await,
        pairs(&[("Google", 40)])
    );
    let (rows, said) = ask(
        &older_store,
        NOV,
        question(
            &[Metric::Visitors],
            &[Dimension::Visit(VisitDim::Browser)],
            Vec::new(),
        ),
        true,
    )
    .await;
    assert!(rows.is_empty() && !said.included, "{rows:?} {said:?}");
    assert!(
        said.warning
            .as_deref()
            .is_some_and(|w| w.contains("no browsers rows")),
        "{said:?}"
    );

    // The same through `POST /api/v2/query`, as Plausible's API says it.
    let (mut child, base) = serve(&db).await;
    let answer = |include: bool| {
        let base = base.clone();
        async move {
            let body = json!({"site_id": "blog", "metrics": ["visitors", "bounce_rate"],
                "date_range": ["2024-11-01", "2024-11-02"], "dimensions": ["visit:browser"],
                "include": {"imports": include}});
            let r = crate::support::client()
                .post(format!("{base}/api/v2/query"))
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .expect("query");
            assert_eq!(r.status(), 200);
            r.json::<Json>().await.expect("json")
        }
    };
    let with = answer(true).await;
    assert_eq!(with["meta"]["imports_included"], true, "{with}");
    assert!(
        with["meta"]["imports_warning"]
            .as_str()
            .is_some_and(|w| w.contains("sums")),
        "{with}"
    );
    assert_eq!(
        with["results"],
        json!([
            {"dimensions": ["Chrome"], "metrics": [140, 55.0]},
            {"dimensions": ["Firefox"], "metrics": [50, 55.0]},
        ])
    );
    let without = answer(false).await;
    assert_eq!(without["results"], json!([]), "{without}");
    assert!(without["meta"].get("imports_included").is_none());
    // The dashboard includes them, as Plausible's does, and says so.
    let page = crate::support::client()
        .get(format!(
            "{base}/dashboard/blog?from=2024-11-01&to=2024-11-02"
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("dashboard")
        .text()
        .await
        .expect("html");
    assert!(page.contains("id=\"imports-note\""), "the page says it");
    assert!(
        page.contains(">Chrome<") && page.contains(">macOS<"),
        "{page}"
    );
    child.kill().await.expect("kill");
}

const TOKEN: &str = "import-dims-admin-token-0123";

/// `tally serve` on the test's database, on a free port, with an admin token.
async fn serve(db: &Db) -> (tokio::process::Child, String) {
    let mut child = db
        .cmd(&["serve", "--listen", "127.0.0.1:0"])
        .env("TALLY_ADMIN_TOKEN", TOKEN)
        // No secret file in the working directory (a PostgreSQL URL would put one there).
        .env("TALLY_SECRET", "import-dims-test-secret-0123456789abcdef")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("line");
    let base = line
        .strip_prefix("listening on ")
        .expect("listening")
        .to_owned();
    (child, base)
}

/// `tally export --what breakdowns` as (day, dimension, value) → its JSON row.
async fn exported(db: &Db, range: (Date, Date)) -> Vec<Json> {
    let text = db
        .export(&[
            "--what",
            "breakdowns",
            "--format",
            "json",
            "--from",
            &range.0.to_string(),
            "--to",
            &range.1.to_string(),
        ])
        .await;
    serde_json::from_str::<Vec<Json>>(&text).expect("a JSON array")
}

// Counted visits (a log), imported events (GoatCounter) and imported breakdowns (Plausible)
// exported per day and dimension: every row is what the analytics answer for that range.
on_both!(export_of_breakdowns_is_what_the_analytics_answer);
async fn export_of_breakdowns_is_what_the_analytics_answer(db: Db) {
    let zip = db.dir.join("plausible.zip");
    plausible_export(&zip);
    db.import("plausible", &zip, &[]).await;
    db.import("goatcounter", &sample("goatcounter-dims.csv"), &[])
        .await;
    db.import("combined", &sample("access.log"), &[]).await;
    db.verify_clean().await;
    let range = (date(2024, 11, 1), date(2025, 3, 3));
    let rows = exported(&db, range).await;
    let store = db.store().await;
    let metrics = [
        Metric::Visitors,
        Metric::Visits,
        Metric::Pageviews,
        Metric::Events,
        Metric::BounceRate,
        Metric::VisitDuration,
    ];
    let mut checked = 0;
    for (name, dim) in Dimension::ALL
        .iter()
        .filter(|(_, d)| !matches!(d, Dimension::Time(_)))
    {
        let asked: Vec<Metric> = metrics
            .iter()
            .copied()
            .filter(|m| {
                question(&[*m], &[Dimension::Time(Grain::Day), *dim], Vec::new())
                    .check()
                    .is_ok()
            })
            .collect();
        let (answer, _) = ask(
            &store,
            range,
            question(&asked, &[Dimension::Time(Grain::Day), *dim], Vec::new()),
            true,
        )
        .await;
        let mut want: Vec<(String, String, Vec<Json>)> = answer
            .iter()
            .map(|(d, _)| (d[0].clone(), d[1].clone(), Vec::new()))
            .collect();
        // The metrics as JSON values, the way the API and the export write them.
        let analytics = Analytics::new(store.clone(), 1 << 20);
        let full = analytics
            .answer_with(
                &blog(),
                &SiteZone::utc(),
                range.0,
                range.1,
                &[question(
                    &asked,
                    &[Dimension::Time(Grain::Day), *dim],
                    Vec::new(),
                )],
                true,
            )
            .await
            .expect("answers");
        for (slot, row) in want.iter_mut().zip(&full[0].0.rows) {
            slot.2 = metrics
                .iter()
                .map(|m| match asked.iter().position(|x| x == m) {
                    Some(i) => match row.metrics[i] {
                        Value::Int(n) => json!(n),
                        Value::Float(x) => json!(x),
                        Value::Null => Json::Null,
                    },
                    None => Json::Null,
                })
                .collect();
        }
        let mut got: Vec<(String, String, Vec<Json>)> = rows
            .iter()
            .filter(|r| r["dimension"] == *name)
            .map(|r| {
                (
                    r["day"].as_str().unwrap_or("").to_owned(),
                    r["value"].as_str().unwrap_or("").to_owned(),
                    metrics.iter().map(|m| r[m.name()].clone()).collect(),
                )
            })
            .collect();
        want.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        got.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        assert!(!want.is_empty(), "{name}: rows to compare");
        assert_eq!(got, want, "{name}");
        checked += want.len();
    }
    assert_eq!(rows.len(), checked, "no other rows");
    // A day of the log (2025-03-02, counted events) and a day of Plausible both appear.
    assert!(rows.iter().any(|r| r["day"] == "2025-03-02"));
    assert!(
        rows.iter()
            .any(|r| r["day"] == "2024-11-01" && r["value"] == "Chrome")
    );

    let visits = db
        .export(&[
            "--what",
            "visits",
            "--from",
            "2024-11-01",
            "--to",
            "2024-11-02",
        ])
        .await;
    assert_eq!(
        visits,
        "day,visitors,visits,pageviews,views_per_visit,bounce_rate,visit_duration\n\
         2024-11-01,130,150,178,1.19,53,140\n\
         2024-11-02,95,110,122,1.11,55,136\n"
    );
}
