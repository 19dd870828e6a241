//! Day boundaries in the site's time zone, with the clock injected.

use jiff::Timestamp;

use crate::support::{Options, event_id_at, pageview, spawn_app_with};

const V: &str = "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e01";

/// `last_second` is one second before local midnight (UTC timestamp).
async fn midnight_splits_days(zone: &'static str, last_second: &str) {
    let last: Timestamp = last_second.parse().expect("ts");
    let mut app = spawn_app_with(Options {
        at: last,
        zone,
        ..Options::default()
    })
    .await;
    // 23:59:59.999 local: the last moment of the day.
    let before = last + jiff::SignedDuration::from_millis(999);
    app.clock.set(before);
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(before), Some(V), "/a"))
            .await,
        "accepted"
    );
    let c = app.counts("/a").await;
    assert_eq!(
        (c.page.today.views, c.page.today.visitors),
        (1, 1),
        "{zone}: counted today"
    );

    // 00:00:00.000 local: a new day; the view above belongs to yesterday.
    let after = last + jiff::SignedDuration::from_secs(1);
    app.clock.set(after);
    let c = app.counts("/a").await;
    assert_eq!(
        (c.page.today.views, c.page.today.visitors),
        (0, 0),
        "{zone}: new day is empty"
    );
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(after), Some(V), "/a"))
            .await,
        "accepted"
    );
    let c = app.counts("/a").await;
    assert_eq!(
        (c.page.today.views, c.page.today.visitors),
        (1, 1),
        "{zone}: same visitor, new day"
    );
    assert_eq!(
        (c.page.views, c.page.visitors),
        (2, 1),
        "{zone}: all-time visitors are distinct"
    );

    // A late beacon for the old day (sent before midnight, delivered after) lands on the old day.
    let late = event_id_at(last);
    assert_eq!(
        app.hit_status(&pageview(&late, Some(V), "/a")).await,
        "accepted"
    );
    let c = app.counts("/a").await;
    assert_eq!(
        c.page.today.views, 1,
        "{zone}: the late event did not land today"
    );
    assert_eq!(c.page.views, 3);
    app.assert_no_drift().await;
    app.stop().await;
}

#[tokio::test]
async fn berlin_midnight_on_the_dst_change_night() {
    // 2026-03-29 00:00 CET (UTC+1) = 2026-03-28T23:00:00Z; clocks move at 02:00 that night.
    midnight_splits_days("Europe/Berlin", "2026-03-28T22:59:59Z").await;
}

#[tokio::test]
async fn new_york_midnight_is_five_hours_after_utc_midnight() {
    midnight_splits_days("America/New_York", "2026-01-15T04:59:59Z").await;
}

#[tokio::test]
async fn kathmandu_quarter_hour_offset() {
    // UTC+05:45: local midnight of 2026-07-02 is 2026-07-01T18:15:00Z.
    midnight_splits_days("Asia/Kathmandu", "2026-07-01T18:14:59Z").await;
}

#[tokio::test]
async fn a_visitor_without_id_is_one_visitor_for_the_whole_local_day() {
    // Tokyo (UTC+9): the local day 2026-05-11 runs from 2026-05-10T15:00Z to 2026-05-11T15:00Z,
    // so these two hits fall on two UTC days but on one local day.
    let first: Timestamp = "2026-05-10T23:30:00Z".parse().expect("ts");
    let second: Timestamp = "2026-05-11T00:30:00Z".parse().expect("ts");
    let mut app = spawn_app_with(Options {
        at: first,
        zone: "Asia/Tokyo",
        ..Options::default()
    })
    .await;
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(first), None, "/a"))
            .await,
        "accepted"
    );
    app.clock.set(second);
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(second), None, "/a"))
            .await,
        "accepted"
    );
    let c = app.counts("/a").await;
    assert_eq!((c.page.today.views, c.page.today.visitors), (2, 1));
    app.stop().await;
}
