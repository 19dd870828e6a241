//! The dashboard's daily bar chart, as inline SVG that needs no JavaScript.
//!
//! Contract: [`daily_chart`] is a pure function from day points to one well-formed `<svg>`
//! element that never panics. It is responsive without scaling its text: no `viewBox`; the
//! height is fixed in px and every x coordinate is a percentage of the width, so the 11 px
//! labels stay 11 px on a 390 px phone and on a desktop. The y labels sit left of the plot
//! (`x < 0`, drawn with `overflow="visible"`; the page gives the SVG a left margin of
//! [`Y_LABEL_GUTTER`] px). It
//! draws per day a pale bar for views with a narrower solid bar for visitors in front, a light
//! grid with up to four nicely rounded y-axis ticks ([`nice_max`], labels by
//! [`abbreviate`]), x-axis labels (`Mar 3`) on every Nth day counted back from the newest so
//! they never overlap — one set for wide screens (class `wide`) and one for narrow ones (class
//! `narrow`, hidden by a `display="none"` attribute that the page's CSS lifts below 600 px;
//! labels in both sets carry neither class) — and a `<title>` per day (`2026-03-03: 120 views, 45 visitors`) that a
//! browser shows on hover. No points yields a friendly empty state, not an empty axis.
//!
//! Styling: bars carry the classes `views` and `visitors` (and the root `tally-chart`) with
//! presentation attributes for the default indigo look; page CSS beats presentation
//! attributes, so the dashboard can restyle them. No `<style>` element is emitted, since one
//! inside inline SVG would apply to the whole page. Only dates and numbers go in, and the text
//! is escaped all the same.

use jiff::civil::Date;

use super::badge::{abbreviate, escape_xml, group};

/// One day's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayPoint {
    /// The local calendar day.
    pub day: Date,
    /// Page views that day.
    pub views: u64,
    /// Distinct visitors that day.
    pub visitors: u64,
}

/// Height in px; the width is the container's.
const HEIGHT: f64 = 200.0;
/// Room left of the plot for the y labels, in px (the page sets it as the SVG's left margin).
pub const Y_LABEL_GUTTER: f64 = 40.0;
/// Plot area margins in px: x labels below.
const TOP: f64 = 10.0;
const BOTTOM: f64 = 24.0;
const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;
/// Plot widths the x labels are spaced for: a desktop and a 390 px phone.
const WIDE_PLOT_W: f64 = 640.0;
const NARROW_PLOT_W: f64 = 290.0;
/// Share of a day's slot the views bar fills, and of the views bar the visitors bar fills.
const BAR_SHARE: f64 = 0.8;
/// Widest a views bar gets, in percent of the plot, so a chart of one or a few days does not
/// look like a wall.
const MAX_BAR_PCT: f64 = 6.0;
const VISITOR_SHARE: f64 = 0.6;
/// Horizontal room one x label (`Mar 30`) needs, with a gap.
const X_LABEL_ROOM: f64 = 60.0;
/// Day steps between x labels, tried smallest first.
const X_STEPS: [usize; 10] = [1, 2, 3, 7, 14, 28, 56, 91, 182, 364];

const TEXT_ATTRS: &str = r##"font-family="system-ui,sans-serif" font-size="11" fill="#6b7280""##;

/// The chart for `points`, oldest first (the order they are drawn in).
pub fn daily_chart(points: &[DayPoint]) -> String {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return empty_state();
    };
    let label = escape_xml(&format!(
        "Daily views and visitors, {} to {}",
        first.day, last.day
    ));
    let mut svg = open_svg(&label);

    let max = points
        .iter()
        .map(|p| p.views.max(p.visitors))
        .max()
        .unwrap_or(0);
    let (step, top) = y_axis(max);
    push_grid(&mut svg, step, top);

    let slot = 100.0 / points.len() as f64;
    let wide_every = x_label_step(points.len(), WIDE_PLOT_W);
    let narrow_every = x_label_step(points.len(), NARROW_PLOT_W);
    for (i, p) in points.iter().enumerate() {
        let x = slot * i as f64;
        push_day(&mut svg, p, x, slot, top);
        let back = points.len() - 1 - i;
        let (wide, narrow) = (
            back.is_multiple_of(wide_every),
            back.is_multiple_of(narrow_every),
        );
        let class = match (wide, narrow) {
            (false, false) => continue,
            (true, true) => "x-label",
            (true, false) => "x-label wide",
            (false, true) => r#"x-label narrow" display="none"#,
        };
        let text = escape_xml(&p.day.strftime("%b %-d").to_string());
        svg.push_str(&format!(
            r#"<text class="{class}" x="{}%" y="{}" text-anchor="middle" {TEXT_ATTRS}>{text}</text>"#,
            n2(x + slot / 2.0),
            n2(HEIGHT - 6.0),
        ));
    }
    svg.push_str("</svg>");
    svg
}

fn open_svg(aria_label: &str) -> String {
    format!(
        r#"<svg class="tally-chart" xmlns="http://www.w3.org/2000/svg" width="100%" height="{HEIGHT}" overflow="visible" role="img" aria-label="{aria_label}">"#
    )
}

fn empty_state() -> String {
    let mut svg = open_svg("No visits yet");
    svg.push_str(&format!(
        r#"<text class="empty" x="50%" y="{}" text-anchor="middle" {TEXT_ATTRS}>No visits in this period yet.</text></svg>"#,
        HEIGHT / 2.0
    ));
    svg
}

/// Horizontal grid lines and their labels, from 0 to `top` every `step`.
fn push_grid(svg: &mut String, step: u64, top: u64) {
    let mut tick = 0u64;
    loop {
        let y = TOP + PLOT_H * (1.0 - ratio(tick, top));
        svg.push_str(&format!(
            r##"<line class="grid" x1="0" x2="100%" y1="{y}" y2="{y}" stroke="#e5e7eb" stroke-width="1"/>"##,
            y = n2(y),
        ));
        svg.push_str(&format!(
            r#"<text class="y-label" x="{}" y="{}" text-anchor="end" {TEXT_ATTRS}>{}</text>"#,
            -6.0,
            n2(y + 4.0),
            escape_xml(&abbreviate(tick)),
        ));
        match tick.checked_add(step) {
            Some(next) if next <= top && step > 0 => tick = next,
            _ => break,
        }
    }
}

/// One day: a transparent full-height hover target, the views bar, the visitors bar, and the
/// `<title>` the browser shows on hover.
fn push_day(svg: &mut String, p: &DayPoint, x: f64, slot: f64, top: u64) {
    let title = escape_xml(&format!(
        "{}: {} {}, {} {}",
        p.day,
        group(p.views),
        if p.views == 1 { "view" } else { "views" },
        group(p.visitors),
        if p.visitors == 1 {
            "visitor"
        } else {
            "visitors"
        },
    ));
    let bar_w = (slot * BAR_SHARE).min(MAX_BAR_PCT);
    let bar_x = x + (slot - bar_w) / 2.0;
    let vis_w = bar_w * VISITOR_SHARE;
    let vis_x = x + (slot - vis_w) / 2.0;
    svg.push_str(&format!(
        r#"<g><title>{title}</title><rect class="hit" x="{}%" y="{TOP}" width="{}%" height="{PLOT_H}" fill="transparent"/>"#,
        n2(x),
        n2(slot),
    ));
    for (class, value, bar_x, bar_w, paint) in [
        (
            "views",
            p.views,
            bar_x,
            bar_w,
            r##"fill="#6366f1" fill-opacity="0.35""##,
        ),
        ("visitors", p.visitors, vis_x, vis_w, r##"fill="#4f46e5""##),
    ] {
        let h = PLOT_H * ratio(value, top);
        svg.push_str(&format!(
            r#"<rect class="{class}" x="{}%" y="{}" width="{}%" height="{}" {paint}/>"#,
            n2(bar_x),
            n2(TOP + PLOT_H - h),
            n2(bar_w),
            n2(h),
        ));
    }
    svg.push_str("</g>");
}

/// `value / top`, clamped to `0..=1` (0 when `top` is 0).
fn ratio(value: u64, top: u64) -> f64 {
    if top == 0 {
        return 0.0;
    }
    (value as f64 / top as f64).clamp(0.0, 1.0)
}

/// A coordinate with two decimals at most, trailing zeros dropped.
fn n2(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_owned()
    } else {
        s.to_owned()
    }
}

/// Every how many days an x label goes, so that labels do not overlap on a plot `plot_w` px
/// wide.
fn x_label_step(days: usize, plot_w: f64) -> usize {
    let fits = (plot_w / X_LABEL_ROOM) as usize;
    X_STEPS
        .iter()
        .copied()
        .find(|step| days.div_ceil(*step) <= fits)
        .unwrap_or_else(|| days.div_ceil(fits.max(1)))
}

/// The y axis for data peaking at `max`: `(step, top)` with `top = step × k`, `k ≤ 4`, and
/// `step` a nice number (1, 2, 2.5 or 5 × 10^k; 2.5 only where it is a whole number).
fn y_axis(max: u64) -> (u64, u64) {
    let quarter = max.div_ceil(4).max(1);
    let mut step = nice_max(quarter);
    if step >= 50 && leading_digit(step) == 5 && step / 2 >= quarter {
        step /= 2;
    }
    let top = step.saturating_mul(max.div_ceil(step).max(1));
    (step, top)
}

fn leading_digit(mut n: u64) -> u64 {
    while n >= 10 {
        n /= 10;
    }
    n
}

/// The smallest number of the form 1, 2 or 5 × 10^k that is at least `n` (`0` and `1` give
/// `1`; `120` gives `200`; `500` gives `500`). Saturates at `u64::MAX` past 10^19.
pub fn nice_max(n: u64) -> u64 {
    let mut pow: u64 = 1;
    loop {
        for m in [1, 2, 5] {
            match pow.checked_mul(m) {
                Some(v) if v >= n => return v,
                Some(_) => {}
                None => return u64::MAX,
            }
        }
        match pow.checked_mul(10) {
            Some(next) => pow = next,
            None => return u64::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::badge::tests::assert_well_formed;
    use jiff::ToSpan;

    fn series(views: &[u64]) -> Vec<DayPoint> {
        let start = jiff::civil::date(2026, 3, 1);
        views
            .iter()
            .enumerate()
            .map(|(i, &v)| DayPoint {
                day: start.checked_add((i as i64).days()).expect("in range"),
                views: v,
                visitors: v / 3,
            })
            .collect()
    }

    /// The `height` attribute of every `<rect class="{class}"`.
    fn heights(svg: &str, class: &str) -> Vec<f64> {
        svg.split(&format!(r#"<rect class="{class}""#))
            .skip(1)
            .map(|rest| {
                let h = rest.split(r#"height=""#).nth(1).expect("height");
                h[..h.find('"').expect("quote")].parse().expect("number")
            })
            .collect()
    }

    #[test]
    fn nice_max_rounds_up_to_1_2_5() {
        for (n, nice) in [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 5),
            (5, 5),
            (6, 10),
            (11, 20),
            (120, 200),
            (200, 200),
            (201, 500),
            (501, 1_000),
            (1_234_567, 2_000_000),
            (10_000_000_000_000_000_000, 10_000_000_000_000_000_000),
            (u64::MAX, u64::MAX),
        ] {
            assert_eq!(nice_max(n), nice, "{n}");
        }
    }

    #[test]
    fn y_axis_has_few_round_ticks() {
        for (max, axis) in [
            (0, (1, 1)),
            (1, (1, 1)),
            (3, (1, 3)),
            (7, (2, 8)),
            (120, (50, 150)),
            (1_000, (250, 1_000)),
            (1_001, (500, 1_500)),
            (12_345, (5_000, 15_000)),
        ] {
            assert_eq!(y_axis(max), axis, "{max}");
        }
        let (step, top) = y_axis(u64::MAX);
        assert!(step > 0 && top == u64::MAX);
    }

    #[test]
    fn one_bar_group_per_day_with_titles() {
        let points = series(&[120, 0, 45, 300, 7]);
        let svg = daily_chart(&points);
        assert_eq!(heights(&svg, "views").len(), points.len());
        assert_eq!(heights(&svg, "visitors").len(), points.len());
        assert_eq!(svg.matches("<title>").count(), points.len());
        assert!(svg.contains("<title>2026-03-01: 120 views, 40 visitors</title>"));
        assert!(svg.contains("<title>2026-03-02: 0 views, 0 visitors</title>"));
        // No viewBox: the text is never scaled; x in percent, y in px.
        assert!(svg.contains(r#"width="100%" height="200" overflow="visible""#));
        assert!(!svg.contains("viewBox"));
        assert!(svg.contains(r#"class="views" x="7%""#), "{svg}");
        assert_well_formed(&svg);
    }

    #[test]
    fn tallest_bar_is_the_maximum() {
        let svg = daily_chart(&series(&[120, 0, 45, 300, 7]));
        let views = heights(&svg, "views");
        let tallest = views.iter().copied().fold(0.0, f64::max);
        assert_eq!(views.iter().position(|&h| h == tallest), Some(3));
        // 300 on an axis topping at 300 (step 100) fills the plot.
        assert_eq!(y_axis(300), (100, 300));
        assert!((tallest - PLOT_H).abs() < 0.01);
        assert_eq!(views[1], 0.0);
        assert!(heights(&svg, "visitors")[3] < tallest);
        for label in [">0<", ">100<", ">200<", ">300<"] {
            assert!(svg.contains(label), "{label}");
        }
    }

    #[test]
    fn empty_state_is_friendly() {
        let svg = daily_chart(&[]);
        assert!(svg.contains("No visits in this period yet."));
        assert!(!svg.contains("<rect"));
        assert_well_formed(&svg);
    }

    #[test]
    fn single_day_and_all_zero() {
        let one = daily_chart(&series(&[1]));
        assert_eq!(heights(&one, "views"), vec![PLOT_H]);
        assert!(one.contains("<title>2026-03-01: 1 view, 0 visitors</title>"));
        assert!(one.contains(">Mar 1<"));
        assert_well_formed(&one);

        let zeros = daily_chart(&series(&[0; 30]));
        assert!(heights(&zeros, "views").iter().all(|&h| h == 0.0));
        assert!(!zeros.contains("NaN") && !zeros.contains("inf"));
        assert_well_formed(&zeros);
    }

    #[test]
    fn a_year_of_days_keeps_labels_apart() {
        let views: Vec<u64> = (0..365).map(|i| (i * 37) % 1_000).collect();
        let points = series(&views);
        let svg = daily_chart(&points);
        assert_eq!(heights(&svg, "views").len(), 365);
        let labels = svg.matches(r#"class="x-label"#).count();
        let wide = labels - svg.matches("x-label narrow").count();
        let narrow = labels - svg.matches("x-label wide").count();
        assert!((2..=11).contains(&wide), "{wide} labels on a desktop");
        assert!((2..=5).contains(&narrow), "{narrow} labels on a phone");
        // The newest day is always labelled.
        let newest = points[364].day.strftime("%b %-d").to_string();
        assert!(svg.contains(&format!(">{newest}<")), "{newest}");
        assert!(!svg.contains("NaN"));
        assert_well_formed(&svg);
    }

    #[test]
    fn label_steps_fit() {
        for plot_w in [WIDE_PLOT_W, NARROW_PLOT_W] {
            for days in [1, 7, 14, 30, 31, 90, 365, 1_000, 100_000] {
                let step = x_label_step(days, plot_w);
                assert!(step >= 1);
                assert!(
                    days.div_ceil(step) as f64 * X_LABEL_ROOM <= plot_w,
                    "{days}"
                );
            }
        }
        assert_eq!(x_label_step(7, WIDE_PLOT_W), 1);
        assert_eq!(x_label_step(7, NARROW_PLOT_W), 2);
    }

    #[test]
    fn huge_counts_do_not_break_the_axis() {
        let points = vec![DayPoint {
            day: jiff::civil::date(2026, 1, 1),
            views: u64::MAX,
            visitors: u64::MAX / 2,
        }];
        let svg = daily_chart(&points);
        assert!(svg.contains("18,446,744,073,709,551,615 views"));
        assert_well_formed(&svg);
    }
}
