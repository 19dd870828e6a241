//! Shields-style SVG counter badges: `label | value`, grey on the left, a colour on the right.
//!
//! Contract: [`Badge::render`] is a pure function from strings to a complete, well-formed SVG
//! document; it never panics and no input can inject markup. Label and value are cleaned first
//! (see [`clean`]): control characters and characters XML forbids are removed, surrounding
//! whitespace is trimmed, and anything past [`MAX_CHARS`] characters is cut and ends in `…`.
//! Every textual output is XML-escaped ([`escape_xml`]); colours are a parsed type
//! ([`BadgeColor`]) that can only print as `#rgb` or `#rrggbb`.
//!
//! Widths: boxes are sized from the advance widths of DejaVu Sans at 11px, generated from the
//! real font file by `scripts/gen-badge-widths.py` into `badge_widths.rs` (see [`text_width`]).
//! The font stack names Verdana first, as shields does, and a reader's machine may have
//! neither font; so each `<text>` also carries `textLength` set to the measured width, which
//! makes every SVG renderer stretch or squeeze the glyphs to fit the box exactly, whatever font
//! it picked. DejaVu Sans descends from Bitstream Vera, whose metrics are close to Verdana's,
//! so the adjustment is small in practice.
//!
//! Ids: the flat style's gradient and clip path have ids that depend only on their content
//! (`tally-badge-s`, `tally-badge-p`, `tally-badge-r{width}-{height}-{radius}`), so several badges inlined in one HTML page can
//! share them without one badge clipping another.
//!
//! Counts are shown with [`abbreviate`] (`12.3k`, never overstating) or [`group`] (`12,345`).

#[path = "badge_widths.rs"]
mod widths;

#[path = "badge_widths_bold.rs"]
mod bold;

use std::fmt;

/// Longest label or value, in characters, kept by [`clean`]; longer text ends in `…`.
pub const MAX_CHARS: usize = 64;

/// Horizontal padding on each side of a text, in px (as shields).
const PAD: f64 = 5.0;
/// Badge height in px.
const HEIGHT: u32 = 20;
const FONT_FAMILY: &str = "Verdana,Geneva,DejaVu Sans,sans-serif";

/// The badge's shape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BadgeStyle {
    /// Rounded corners (r=3) and a subtle vertical gradient: shields' default.
    #[default]
    Flat,
    /// Square corners, no gradient.
    FlatSquare,
    /// 18 px high, rounder corners (r=4), a glossier gradient.
    Plastic,
    /// 28 px high, upper case, letter-spaced, bold value, square corners.
    ForTheBadge,
}

impl BadgeStyle {
    /// Parse a `style` parameter: `flat`, `flat-square`, `plastic` or `for-the-badge`;
    /// anything else is `None`.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "flat" => Some(Self::Flat),
            "flat-square" => Some(Self::FlatSquare),
            "plastic" => Some(Self::Plastic),
            "for-the-badge" => Some(Self::ForTheBadge),
            _ => None,
        }
    }
}

/// A badge colour: an RGB triple, so it can only ever print as a hex colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadgeColor([u8; 3]);

/// Shields' named colours and their aliases, as `badge-maker` 6 draws them (the darker,
/// higher-contrast set; `blueviolet` is the CSS colour badge-maker also accepts).
const NAMED: &[(&str, [u8; 3])] = &[
    ("brightgreen", [0x44, 0xbb, 0x00]),
    ("success", [0x44, 0xbb, 0x00]),
    ("green", [0x67, 0xac, 0x09]),
    ("yellowgreen", [0x95, 0x99, 0x1a]),
    ("yellow", [0xd8, 0xb8, 0x00]),
    ("orange", [0xea, 0x72, 0x33]),
    ("important", [0xea, 0x72, 0x33]),
    ("red", [0xdd, 0x43, 0x43]),
    ("critical", [0xdd, 0x43, 0x43]),
    ("blue", [0x00, 0x7e, 0xc6]),
    ("informational", [0x00, 0x7e, 0xc6]),
    ("blueviolet", [0x8a, 0x2b, 0xe2]),
    ("grey", [0x55, 0x55, 0x55]),
    ("gray", [0x55, 0x55, 0x55]),
    ("lightgrey", [0x93, 0x93, 0x93]),
    ("lightgray", [0x93, 0x93, 0x93]),
    ("inactive", [0x93, 0x93, 0x93]),
];

impl BadgeColor {
    /// Shields' `blue`, `#007ec6`: the colour to fall back to.
    pub const BLUE: Self = Self([0x00, 0x7e, 0xc6]);

    /// Parse a shields colour name (ASCII case-insensitive) or hex `RGB` / `RRGGBB`, with or
    /// without a leading `#`. Anything else is `None`.
    pub fn parse(raw: &str) -> Option<Self> {
        if let Some(&(_, rgb)) = NAMED
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(raw))
        {
            return Some(Self(rgb));
        }
        let hex = raw.strip_prefix('#').unwrap_or(raw);
        if hex.len() != 3 && hex.len() != 6 {
            return None;
        }
        let digits: Vec<u8> = hex
            .chars()
            .map(|c| c.to_digit(16).and_then(|d| u8::try_from(d).ok()))
            .collect::<Option<_>>()?;
        match digits[..] {
            [r, g, b] => Some(Self([r * 17, g * 17, b * 17])),
            [r1, r2, g1, g2, b1, b2] => Some(Self([r1 * 16 + r2, g1 * 16 + g2, b1 * 16 + b2])),
            _ => None,
        }
    }

    /// Whether text on this colour should be dark (shields' brightness rule).
    fn is_light(self) -> bool {
        let [r, g, b] = self.0.map(f64::from);
        // Rounded to two decimals first, as badge-maker does.
        ((0.299 * r + 0.587 * g + 0.114 * b) / 255.0 * 100.0).round() / 100.0 > 0.69
    }
}

impl Default for BadgeColor {
    fn default() -> Self {
        Self::BLUE
    }
}

/// Prints `#rgb` when every channel repeats its digit, else `#rrggbb` (lowercase).
impl fmt::Display for BadgeColor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [r, g, b] = self.0;
        if [r, g, b].iter().all(|c| c % 17 == 0) {
            write!(f, "#{:x}{:x}{:x}", r / 17, g / 17, b / 17)
        } else {
            write!(f, "#{r:02x}{g:02x}{b:02x}")
        }
    }
}

/// Parse a colour parameter into its canonical hex form (`"4c1"` → `"#4c1"`,
/// `"red"` → `"#e05d44"`); `None` for anything that is not a known name or hex colour.
pub fn parse_color(raw: &str) -> Option<String> {
    BadgeColor::parse(raw).map(|c| c.to_string())
}

/// A badge to render. Label and value are raw user text; [`Badge::render`] cleans and escapes
/// them. An empty label (after cleaning) renders a value-only badge.
#[derive(Debug, Clone, Copy)]
pub struct Badge<'a> {
    /// Left-hand text, on `label_color`.
    pub label: &'a str,
    /// Right-hand text, on `color`.
    pub value: &'a str,
    /// Fill of the value box.
    pub color: BadgeColor,
    /// Fill of the label box; `None` is shields' grey `#555`.
    pub label_color: Option<BadgeColor>,
    /// Shape.
    pub style: BadgeStyle,
}

/// Geometry of one style: height, corner radius, text baselines, gradient stops.
struct Shape {
    height: u32,
    radius: u32,
    text_y: u32,
    shadow_y: u32,
    /// `(offset, colour, opacity)` of the overlay gradient; empty for none.
    gradient: &'static [(&'static str, &'static str, &'static str)],
}

const FLAT: Shape = Shape {
    height: HEIGHT,
    radius: 3,
    text_y: 14,
    shadow_y: 15,
    gradient: &[("0", "#bbb", ".1"), ("1", "#000", ".1")],
};
const FLAT_SQUARE: Shape = Shape {
    height: HEIGHT,
    radius: 0,
    text_y: 14,
    shadow_y: 15,
    gradient: &[],
};
const PLASTIC: Shape = Shape {
    height: 18,
    radius: 4,
    text_y: 13,
    shadow_y: 14,
    gradient: &[
        ("0", "#fff", ".7"),
        (".1", "#aaa", ".1"),
        (".9", "#000", ".3"),
        ("1", "#000", ".5"),
    ],
};

/// `for-the-badge`: 28 px high, upper case, 10 px text with 1.25 px letter spacing, the value
/// bold, 12 px margins, square corners (as shields' `badge-maker`).
const FTB_HEIGHT: u32 = 28;
const FTB_MARGIN: f64 = 12.0;
const FTB_LETTER_SPACING: f64 = 1.25;
/// The label is measured with the 11 px table scaled to 10 px.
const FTB_LABEL_SCALE: f64 = 10.0 / widths::FONT_SIZE_PX;

impl Badge<'_> {
    /// The complete SVG document.
    pub fn render(&self) -> String {
        if self.style == BadgeStyle::ForTheBadge {
            return self.render_for_the_badge();
        }
        let shape = match self.style {
            BadgeStyle::FlatSquare => &FLAT_SQUARE,
            BadgeStyle::Plastic => &PLASTIC,
            _ => &FLAT,
        };
        let label = clean(self.label);
        let value = clean(self.value);
        let label_text = text_width(&label);
        let value_text = text_width(&value);
        let label_w = if label.is_empty() {
            0.0
        } else {
            box_width(label_text)
        };
        let value_w = box_width(value_text);
        let mut svg = self.open(&label, &value, label_w + value_w, shape);
        let label_color = self.label_color.unwrap_or(GREY);
        svg.push_str(r#"<g text-anchor="middle" font-family=""#);
        svg.push_str(FONT_FAMILY);
        svg.push_str(r#"" text-rendering="geometricPrecision" font-size="11">"#);
        if label_w > 0.0 {
            push_text(
                &mut svg,
                &label,
                label_text,
                label_w / 2.0,
                label_color.is_light(),
                shape,
            );
        }
        push_text(
            &mut svg,
            &value,
            value_text,
            label_w + value_w / 2.0,
            self.color.is_light(),
            shape,
        );
        svg.push_str("</g></svg>");
        svg
    }

    /// The root, title, defs and the two boxes (label box only when `label_w > 0`).
    fn open(&self, label: &str, value: &str, total: f64, shape: &Shape) -> String {
        let title = if label.is_empty() {
            escape_xml(value)
        } else {
            escape_xml(&format!("{label}: {value}"))
        };
        let label_w = total - self.box_w(label, value, total);
        let (w, lw, h) = (num(total), num(label_w), shape.height);
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" aria-label="{title}"><title>{title}</title>"#
        );
        let gradient_id = if shape.gradient.len() > 2 {
            "tally-badge-p"
        } else {
            "tally-badge-s"
        };
        if !shape.gradient.is_empty() {
            svg.push_str(&format!(
                r#"<linearGradient id="{gradient_id}" x2="0" y2="100%">"#
            ));
            for (offset, color, opacity) in shape.gradient {
                svg.push_str(&format!(
                    r#"<stop offset="{offset}" stop-color="{color}" stop-opacity="{opacity}"/>"#
                ));
            }
            svg.push_str("</linearGradient>");
        }
        if shape.radius > 0 {
            let r = shape.radius;
            svg.push_str(&format!(
                r##"<clipPath id="tally-badge-r{w}-{h}-{r}"><rect width="{w}" height="{h}" rx="{r}" fill="#fff"/></clipPath><g clip-path="url(#tally-badge-r{w}-{h}-{r})">"##
            ));
        } else {
            svg.push_str(r#"<g shape-rendering="crispEdges">"#);
        }
        if label_w > 0.0 {
            svg.push_str(&format!(
                r#"<rect width="{lw}" height="{h}" fill="{}"/>"#,
                self.label_color.unwrap_or(GREY)
            ));
        }
        svg.push_str(&format!(
            r#"<rect x="{lw}" width="{}" height="{h}" fill="{}"/>"#,
            num(total - label_w),
            self.color
        ));
        if !shape.gradient.is_empty() {
            svg.push_str(&format!(
                r#"<rect width="{w}" height="{h}" fill="url(#{gradient_id})"/>"#
            ));
        }
        svg.push_str("</g>");
        svg
    }

    /// Width of the value box of a badge `total` wide (the label box is the rest).
    fn box_w(&self, label: &str, value: &str, total: f64) -> f64 {
        match self.style {
            BadgeStyle::ForTheBadge => ftb_widths(label, value).1,
            _ if label.is_empty() => total,
            _ => box_width(text_width(value)),
        }
    }

    fn render_for_the_badge(&self) -> String {
        let label = clean(self.label).to_uppercase();
        let value = clean(self.value).to_uppercase();
        let (label_w, value_w) = ftb_widths(&label, &value);
        let shape = Shape {
            height: FTB_HEIGHT,
            radius: 0,
            text_y: 0,
            shadow_y: 0,
            gradient: &[],
        };
        let mut svg = self.open(&label, &value, label_w + value_w, &shape);
        svg.push_str(r#"<g text-anchor="middle" font-family=""#);
        svg.push_str(FONT_FAMILY);
        svg.push_str(r#"" text-rendering="geometricPrecision" font-size="10">"#);
        let label_color = self.label_color.unwrap_or(GREY);
        for (text, left, width, bold, light) in [
            (&label, 0.0, label_w, false, label_color.is_light()),
            (&value, label_w, value_w, true, self.color.is_light()),
        ] {
            if width <= 0.0 || text.is_empty() {
                continue;
            }
            let fill = if light { "#333" } else { "#fff" };
            let weight = if bold { r#" font-weight="bold""# } else { "" };
            svg.push_str(&format!(
                r#"<text x="{}" y="17.5" fill="{fill}" letter-spacing="{FTB_LETTER_SPACING}" textLength="{}" lengthAdjust="spacingAndGlyphs"{weight}>{}</text>"#,
                num(left + width / 2.0),
                num(width - 2.0 * FTB_MARGIN),
                escape_xml(text),
            ));
        }
        svg.push_str("</g></svg>");
        svg
    }
}

/// Shields' grey label box.
const GREY: BadgeColor = BadgeColor([0x55, 0x55, 0x55]);

/// `(label box, value box)` widths of a `for-the-badge` badge: the text (regular 10 px for
/// the label, bold for the value, whole pixels) plus 1.25 px per character, plus margins.
fn ftb_widths(label: &str, value: &str) -> (f64, f64) {
    let spaced = |w: f64, s: &str| w.ceil() + FTB_LETTER_SPACING * s.chars().count() as f64;
    let label_w = if label.is_empty() {
        0.0
    } else {
        spaced(text_width(label) * FTB_LABEL_SCALE, label) + 2.0 * FTB_MARGIN
    };
    let value_w = if value.is_empty() {
        2.0 * FTB_MARGIN
    } else {
        spaced(bold_width(value), value) + 2.0 * FTB_MARGIN
    };
    (label_w, value_w)
}

/// Width in px of `s` in DejaVu Sans Bold at 10 px (the `for-the-badge` value).
fn bold_width(s: &str) -> f64 {
    s.chars()
        .map(
            |c| match bold::WIDTHS.binary_search_by(|(k, _)| k.cmp(&c)) {
                Ok(i) => bold::WIDTHS[i].1,
                Err(_) if is_wide(c) => bold::FONT_SIZE_PX,
                Err(_) => bold::M_WIDTH,
            },
        )
        .sum()
}

/// A text with its shadow one pixel below, as shields draws it.
fn push_text(svg: &mut String, text: &str, width: f64, center: f64, dark: bool, shape: &Shape) {
    let (fill, shadow) = if dark {
        ("#333", "#ccc")
    } else {
        ("#fff", "#010101")
    };
    let (x, len, text) = (num(center), num(width), escape_xml(text));
    let (y, sy) = (shape.text_y, shape.shadow_y);
    svg.push_str(&format!(
        r#"<text aria-hidden="true" x="{x}" y="{sy}" fill="{shadow}" fill-opacity=".3" textLength="{len}" lengthAdjust="spacingAndGlyphs">{text}</text>"#
    ));
    svg.push_str(&format!(
        r#"<text x="{x}" y="{y}" fill="{fill}" textLength="{len}" lengthAdjust="spacingAndGlyphs">{text}</text>"#
    ));
}

/// Width of a box holding text of `text` px, padded on both sides: the whole pixels rounded
/// up to an odd number, as shields' `badge-maker` does (for pixel-grid alignment of the
/// centred text; `textLength` fits the glyphs to the measured width either way).
fn box_width(text: f64) -> f64 {
    let whole = text.floor();
    let odd = if whole % 2.0 == 0.0 {
        whole + 1.0
    } else {
        whole
    };
    odd + 2.0 * PAD
}

/// A coordinate with at most one decimal, without a trailing `.0`.
fn num(v: f64) -> String {
    let s = format!("{v:.1}");
    match s.strip_suffix(".0") {
        Some(whole) => whole.to_owned(),
        None => s,
    }
}

/// Width in px of `s` set in DejaVu Sans at 11px: the sum of each character's advance (no
/// kerning). Characters missing from the generated table count as one em (11px) when they are
/// East Asian wide or emoji, else as wide as `M`, so unknown text errs on the roomy side.
pub fn text_width(s: &str) -> f64 {
    s.chars().map(char_width).sum()
}

fn char_width(c: char) -> f64 {
    match widths::WIDTHS.binary_search_by(|(k, _)| k.cmp(&c)) {
        Ok(i) => widths::WIDTHS[i].1,
        Err(_) if is_wide(c) => widths::FONT_SIZE_PX,
        Err(_) => widths::M_WIDTH,
    }
}

/// East Asian wide and emoji blocks (rough ranges; enough for sizing a badge).
fn is_wide(c: char) -> bool {
    matches!(u32::from(c),
        0x1100..=0x115F
        | 0x2E80..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x1F300..=0x1F64F
        | 0x1F900..=0x1F9FF
        | 0x20000..=0x3FFFD)
}

/// User text made safe to measure and draw: control characters and XML-forbidden
/// noncharacters (U+FFFE, U+FFFF) removed, surrounding whitespace trimmed, and cut to
/// [`MAX_CHARS`] characters, the last being `…` when anything was cut. Not yet escaped.
pub fn clean(raw: &str) -> String {
    let kept: String = raw
        .chars()
        .filter(|&c| !c.is_control() && c != '\u{FFFE}' && c != '\u{FFFF}')
        .collect();
    let trimmed = kept.trim();
    if trimmed.chars().count() <= MAX_CHARS {
        return trimmed.to_owned();
    }
    let mut cut: String = trimmed.chars().take(MAX_CHARS - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

/// Escape the five XML special characters `& < > " '`.
pub fn escape_xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Units for [`abbreviate`] (short scale), smallest first.
const UNITS: [(u64, &str); 6] = [
    (1_000, "k"),
    (1_000_000, "M"),
    (1_000_000_000, "B"),
    (1_000_000_000_000, "T"),
    (1_000_000_000_000_000, "Qa"),
    (1_000_000_000_000_000_000, "Qi"),
];

/// A count in at most three significant digits with a short-scale suffix: `999`, `1.2k`,
/// `12.3k`, `123k`, `1.2M`, `1B`, … up to `Qi` (10^18). Digits are truncated, not rounded, so
/// the badge never claims more than the true count (`1_999` is `1.9k`, `999_999` is `999k`);
/// a trailing `.0` is dropped.
pub fn abbreviate(n: u64) -> String {
    let Some(&(unit, suffix)) = UNITS.iter().rev().find(|(unit, _)| n >= *unit) else {
        return n.to_string();
    };
    let whole = n / unit;
    let tenths = (n / (unit / 10)) % 10;
    if whole >= 100 || tenths == 0 {
        format!("{whole}{suffix}")
    } else {
        format!("{whole}.{tenths}{suffix}")
    }
}

/// A count with a comma between groups of three digits: `12345` → `12,345`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A small well-formedness check: one root element, every tag closed in order, quoted
    /// attributes, and every `&` starts one of the five predefined entities. Panics with the
    /// reason otherwise. Shared with the chart's tests.
    pub(crate) fn assert_well_formed(svg: &str) {
        let mut stack: Vec<&str> = Vec::new();
        let mut roots = 0;
        let mut rest = svg;
        while let Some(open) = rest.find('<') {
            assert_entities(&rest[..open]);
            let after = &rest[open + 1..];
            let close = tag_end(after).unwrap_or_else(|| panic!("unclosed tag in {svg}"));
            let tag = &after[..close];
            rest = &after[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(
                    stack.pop(),
                    Some(name.trim()),
                    "mismatched </{name}> in {svg}"
                );
                continue;
            }
            let self_closing = tag.ends_with('/');
            let body = tag.trim_end_matches('/');
            let name = body.split_whitespace().next().unwrap_or("");
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric()),
                "bad tag name {name:?} in {svg}"
            );
            assert_entities(body);
            assert_eq!(
                body.matches('"').count() % 2,
                0,
                "unbalanced quotes in <{body}>"
            );
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name);
            }
        }
        assert_entities(rest);
        assert!(rest.trim().is_empty(), "text after the root: {rest:?}");
        assert!(stack.is_empty(), "unclosed elements {stack:?} in {svg}");
        assert_eq!(roots, 1, "expected one root element in {svg}");
    }

    /// Index of the `>` ending a tag, skipping `>` inside quoted attribute values.
    fn tag_end(s: &str) -> Option<usize> {
        let mut quoted = false;
        for (i, c) in s.char_indices() {
            match c {
                '"' => quoted = !quoted,
                '<' => panic!("`<` inside a tag: {s}"),
                '>' if !quoted => return Some(i),
                _ => {}
            }
        }
        None
    }

    fn assert_entities(text: &str) {
        for (i, _) in text.match_indices('&') {
            let tail = &text[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| tail.starts_with(e)),
                "bare & in {text:?}"
            );
        }
    }

    #[test]
    fn the_well_formedness_check_rejects_broken_markup() {
        for broken in [
            "<svg><g></svg>",
            "<svg></g>",
            "<svg><text>a < b</text></svg>",
            "<svg><text>a & b</text></svg>",
            r#"<svg x="1></svg>"#,
            "<svg/><svg/>",
            "<svg>",
        ] {
            let caught = std::panic::catch_unwind(|| assert_well_formed(broken));
            assert!(caught.is_err(), "accepted {broken:?}");
        }
        assert_well_formed(r#"<svg a="&amp;"><g/><text>&lt;ok&gt;</text></svg>"#);
    }

    #[test]
    fn inlined_badges_share_only_identical_defs() {
        let (short, long) = (badge("a", "1").render(), badge("views", "12.3k").render());
        let id = |svg: &str| {
            let start = svg.find("tally-badge-r").expect("clip id");
            svg[start..].split('"').next().expect("id").to_owned()
        };
        assert_ne!(id(&short), id(&long));
        assert_eq!(id(&short), id(&badge("b", "2").render()));
    }

    fn badge<'a>(label: &'a str, value: &'a str) -> Badge<'a> {
        Badge {
            label,
            value,
            color: BadgeColor::default(),
            label_color: None,
            style: BadgeStyle::Flat,
        }
    }

    #[test]
    fn widths_follow_the_font() {
        assert!(text_width("1") < text_width("W"));
        assert!(text_width("i") < text_width("m"));
        assert!(
            (text_width("W") - 10.8765).abs() < 1e-3,
            "{}",
            text_width("W")
        );
        let s = "views 12.3k Ünïcode";
        let sum: f64 = s.chars().map(|c| text_width(&c.to_string())).sum();
        assert!((text_width(s) - sum).abs() < 1e-9);
        assert_eq!(text_width(""), 0.0);
    }

    #[test]
    fn table_is_sorted_and_covers_ascii() {
        assert!(widths::WIDTHS.windows(2).all(|w| w[0].0 < w[1].0));
        for c in ' '..='~' {
            assert!(widths::WIDTHS.iter().any(|(k, _)| *k == c), "{c:?} missing");
        }
        for c in ['é', 'ü', 'ß', 'Ñ', 'ø'] {
            assert!(widths::WIDTHS.iter().any(|(k, _)| *k == c), "{c:?} missing");
        }
    }

    #[test]
    fn unknown_characters_use_documented_fallbacks() {
        assert_eq!(text_width("中"), widths::FONT_SIZE_PX);
        assert_eq!(text_width("🎉"), widths::FONT_SIZE_PX);
        // U+0800 (Samaritan) is not in the table and not wide.
        assert_eq!(text_width("\u{800}"), widths::M_WIDTH);
    }

    #[test]
    fn boxes_fit_the_measured_text() {
        let svg = badge("views", "1.2k").render();
        let label_w = box_width(text_width("views"));
        assert!(svg.contains(&format!(
            r##"<rect width="{}" height="20" fill="#555"/>"##,
            num(label_w)
        )));
        assert!(svg.contains(&format!(r#"textLength="{}""#, num(text_width("views")))));
        let total = label_w + box_width(text_width("1.2k"));
        assert!(svg.starts_with(&format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="20""#,
            num(total)
        )));
        assert!(svg.contains("<title>views: 1.2k</title>"));
        assert!(svg.contains(r#"role="img" aria-label="views: 1.2k""#));
        assert!(svg.contains(FONT_FAMILY));
        assert_well_formed(&svg);
    }

    #[test]
    fn styles() {
        assert_eq!(BadgeStyle::parse("flat"), Some(BadgeStyle::Flat));
        assert_eq!(
            BadgeStyle::parse("flat-square"),
            Some(BadgeStyle::FlatSquare)
        );
        assert_eq!(BadgeStyle::parse("plastic"), Some(BadgeStyle::Plastic));
        assert_eq!(
            BadgeStyle::parse("for-the-badge"),
            Some(BadgeStyle::ForTheBadge)
        );
        assert_eq!(BadgeStyle::parse("social"), None);
        let flat = badge("a", "b").render();
        assert!(flat.contains(r#"rx="3""#) && flat.contains("linearGradient"));
        let square = Badge {
            style: BadgeStyle::FlatSquare,
            ..badge("a", "b")
        }
        .render();
        assert!(!square.contains("rx=") && !square.contains("linearGradient"));
        assert_well_formed(&square);
        let plastic = Badge {
            style: BadgeStyle::Plastic,
            ..badge("a", "b")
        }
        .render();
        assert!(plastic.contains(r#"height="18""#) && plastic.contains(r#"rx="4""#));
        assert_well_formed(&plastic);
        let big = Badge {
            style: BadgeStyle::ForTheBadge,
            label_color: BadgeColor::parse("fff"),
            ..badge("views", "1.2k")
        }
        .render();
        assert!(
            big.contains(r#"height="28""#) && big.contains(">VIEWS<") && big.contains(">1.2K<")
        );
        assert!(big.contains(r##"fill="#fff""##) && big.contains(r##"fill="#333""##));
        assert_well_formed(&big);
    }

    #[test]
    fn empty_label_renders_value_only() {
        let svg = badge(" \u{7} ", "42").render();
        assert!(!svg.contains("#555"));
        assert!(svg.contains("<title>42</title>"));
        assert_eq!(svg.matches("<text").count(), 2);
        assert_well_formed(&svg);
    }

    #[test]
    fn user_text_cannot_inject_markup() {
        let nasty = [
            r#"</text><script>alert(1)</script>"#,
            r#"" onload="alert(1)"#,
            "' onmouseover='x",
            "]]><script>x</script><![CDATA[",
            "<!-- -->&amp;&#x3c;",
        ];
        for raw in nasty {
            for svg in [badge(raw, "1").render(), badge("views", raw).render()] {
                assert!(!svg.contains("<script"), "{svg}");
                assert!(!svg.contains("<!"), "{svg}");
                assert!(!svg.contains(r#"" onload"#), "{svg}");
                assert_well_formed(&svg);
            }
        }
        assert_eq!(
            escape_xml(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&apos;&lt;/a&gt;"
        );
    }

    #[test]
    fn clean_strips_controls_and_truncates() {
        assert_eq!(
            clean("  a\u{0}b\nc\u{1b}[31m\u{7f}\u{9f}\u{FFFF}  "),
            "abc[31m"
        );
        assert_eq!(clean(&"x".repeat(MAX_CHARS)), "x".repeat(MAX_CHARS));
        let long = clean(&"é".repeat(500));
        assert_eq!(long.chars().count(), MAX_CHARS);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn colours() {
        for (raw, hex) in [
            ("brightgreen", "#4b0"),
            ("green", "#67ac09"),
            ("yellow", "#d8b800"),
            ("yellowgreen", "#95991a"),
            ("orange", "#ea7233"),
            ("red", "#dd4343"),
            ("blue", "#007ec6"),
            ("grey", "#555"),
            ("gray", "#555"),
            ("lightgrey", "#939393"),
            ("lightgray", "#939393"),
            ("blueviolet", "#8a2be2"),
            ("success", "#4b0"),
            ("important", "#ea7233"),
            ("critical", "#dd4343"),
            ("informational", "#007ec6"),
            ("inactive", "#939393"),
            ("Red", "#dd4343"),
            ("4c1", "#4c1"),
            ("#4C1", "#4c1"),
            ("ABCDEF", "#abcdef"),
            ("#aabbcc", "#abc"),
            ("#000000", "#000"),
        ] {
            assert_eq!(parse_color(raw).as_deref(), Some(hex), "{raw}");
        }
        for bad in [
            "",
            "#",
            "12",
            "1234",
            "12345",
            "1234567",
            "gggggg",
            "#4c1 ",
            "red;",
            "url(#x)",
            "rgb(1,2,3)",
            "#4c1\" onload=\"x",
            "##4c1",
            "+4c1",
            "４c1",
            "bluee",
        ] {
            assert_eq!(parse_color(bad), None, "{bad}");
        }
        assert_eq!(BadgeColor::default().to_string(), "#007ec6");
    }

    #[test]
    fn light_colours_get_dark_text() {
        let light = BadgeColor::parse("fff").expect("hex");
        let svg = Badge {
            color: light,
            ..badge("a", "b")
        }
        .render();
        assert!(svg.contains(r##"fill="#333""##));
        assert!(!badge("a", "b").render().contains(r##"fill="#333""##));
    }

    #[test]
    fn abbreviations() {
        for (n, s) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1k"),
            (1_234, "1.2k"),
            (1_999, "1.9k"),
            (12_345, "12.3k"),
            (123_456, "123k"),
            (999_999, "999k"),
            (1_000_000, "1M"),
            (1_234_567, "1.2M"),
            (1_000_000_000, "1B"),
            (2_500_000_000_000, "2.5T"),
            (u64::MAX, "18.4Qi"),
        ] {
            assert_eq!(abbreviate(n), s, "{n}");
        }
    }

    #[test]
    fn grouping() {
        for (n, s) in [
            (0, "0"),
            (999, "999"),
            (1_000, "1,000"),
            (12_345, "12,345"),
            (1_234_567, "1,234,567"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ] {
            assert_eq!(group(n), s);
        }
    }

    proptest! {
        #[test]
        fn render_never_panics_or_injects(label in any::<String>(), value in any::<String>(), square: bool) {
            let style = if square { BadgeStyle::FlatSquare } else { BadgeStyle::Flat };
            let big = Badge { label: &label, value: &value, color: BadgeColor::BLUE, label_color: None, style: BadgeStyle::ForTheBadge }.render();
            assert_well_formed(&big);
            let svg = Badge { label: &label, value: &value, color: BadgeColor::BLUE, label_color: None, style }.render();
            prop_assert!(!svg.to_ascii_lowercase().contains("<script"));
            assert_well_formed(&svg);
            prop_assert!(svg.len() < 8_000);
        }

        #[test]
        fn colour_parse_never_panics_and_prints_hex(raw in ".{0,12}") {
            if let Some(hex) = parse_color(&raw) {
                prop_assert!(hex.starts_with('#'));
                prop_assert!(hex[1..].chars().all(|c| c.is_ascii_hexdigit()));
            }
        }

        #[test]
        fn abbreviation_never_overstates(n: u64) {
            let s = abbreviate(n);
            let (digits, suffix) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
            let scale = UNITS.iter().find(|(_, u)| *u == suffix).map_or(1.0, |(v, _)| *v as f64);
            let shown: f64 = digits.parse().expect("number");
            prop_assert!(shown * scale <= n as f64 * (1.0 + 1e-12));
        }
    }
}
