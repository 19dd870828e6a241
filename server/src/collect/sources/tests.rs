use super::*;
use crate::core::dims::{Campaign, SourceDims, classify_source};

fn host(list: &SourceList, h: &str) -> Option<(String, Option<Category>)> {
    list.by_host(h).map(|(n, c)| (n.to_owned(), c))
}

fn name(list: &SourceList, n: &str) -> Option<(String, Option<Category>)> {
    list.by_name(n).map(|(n, c)| (n.to_owned(), c))
}

fn is(n: &str, c: Option<Category>) -> Option<(String, Option<Category>)> {
    Some((n.to_owned(), c))
}

const SEARCH: Option<Category> = Some(Category::Search);
const SOCIAL: Option<Category> = Some(Category::Social);

#[test]
fn the_bundled_tables_are_clean() {
    let list = SourceList::parse(SOURCES_TSV, ALIASES_TSV).expect("no bad row");
    let (hosts, tags, names) = list.counts();
    assert!(
        hosts > 300 && names > 100 && tags > names,
        "{:?}",
        list.counts()
    );
    assert!(SourceList::bundled().skipped().is_empty());
    // No control characters anywhere (tabs separate columns, newlines rows).
    for text in [SOURCES_TSV, ALIASES_TSV] {
        assert!(
            text.chars()
                .all(|c| c == '\t' || c == '\n' || !c.is_control())
        );
    }
}

#[test]
fn the_tables_are_sorted_by_name_then_key() {
    for (file, text) in [("sources.tsv", SOURCES_TSV), ("aliases.tsv", ALIASES_TSV)] {
        let rows: Vec<(String, &str)> = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let mut c = l.split('\t');
                let key = c.next().unwrap_or("");
                (c.next().unwrap_or("").to_lowercase(), key)
            })
            .collect();
        let mut sorted = rows.clone();
        sorted.sort();
        assert!(
            rows == sorted,
            "{file} is not sorted: run scripts/refresh-sources.sh"
        );
    }
}

#[test]
fn no_listed_host_is_a_public_suffix() {
    // The suffixes under which the list names sites (and a few more that look like hosts).
    const SUFFIXES: &[&str] = &[
        "co.uk",
        "co.jp",
        "co.in",
        "co.id",
        "co.il",
        "co.kr",
        "co.nz",
        "co.za",
        "co.th",
        "co.ke",
        "co.tz",
        "co.ug",
        "co.uz",
        "co.ve",
        "co.cr",
        "co.bw",
        "co.ma",
        "com.au",
        "com.ar",
        "com.br",
        "com.mx",
        "com.tr",
        "com.tw",
        "com.hk",
        "com.sg",
        "com.my",
        "com.ph",
        "com.pk",
        "com.vn",
        "com.co",
        "com.pe",
        "com.eg",
        "com.sa",
        "com.ua",
        "com.be",
        "com.bd",
        "com.ng",
        "com.np",
        "com.uy",
        "com.ve",
        "ne.jp",
        "or.jp",
        "org.uk",
        "github.io",
        "blogspot.com",
        "appspot.com",
        "herokuapp.com",
        "pages.dev",
        "netlify.app",
        "vercel.app",
        "workers.dev",
        "web.app",
        "firebaseapp.com",
    ];
    for line in SOURCES_TSV.lines().filter(|l| !l.starts_with('#')) {
        let host = line.split('\t').next().unwrap_or("");
        assert!(!SUFFIXES.contains(&host), "{host} is a public suffix");
    }
    let list = SourceList::bundled();
    for suffix in SUFFIXES {
        assert_eq!(host(&list, &format!("someone.{suffix}")), None, "{suffix}");
    }
}

#[test]
fn hosts_match_with_their_subdomains() {
    let list = SourceList::bundled();
    let google = is("Google", SEARCH);
    for h in [
        "google.com",
        "www.google.com",
        "www.google.co.uk",
        "google.de",
        "www.google.com.br",
        "images.google.fr",
        "WWW.Google.COM",
        "www.google.com.",
        "www.google.com:443",
        "com.google.android.googlequicksearchbox",
    ] {
        assert_eq!(host(&list, h), google, "{h}");
    }
    assert_eq!(
        host(&list, "mail.google.com"),
        is("Gmail", Some(Category::Email))
    );
    assert_eq!(
        host(&list, "gemini.google.com"),
        is("Google Gemini", Some(Category::AiAssistant))
    );
    for h in [
        "facebook.com",
        "l.facebook.com",
        "lm.facebook.com",
        "m.facebook.com",
        "web.facebook.com",
    ] {
        assert_eq!(host(&list, h), is("Facebook", SOCIAL), "{h}");
    }
    for h in [
        "reddit.com",
        "old.reddit.com",
        "out.reddit.com",
        "www.reddit.com",
    ] {
        assert_eq!(host(&list, h), is("Reddit", SOCIAL), "{h}");
    }
    assert_eq!(host(&list, "t.co"), is("Twitter", SOCIAL));
    assert_eq!(host(&list, "x.com"), is("Twitter", SOCIAL));
    assert_eq!(host(&list, "lnkd.in"), is("LinkedIn", SOCIAL));
    assert_eq!(
        host(&list, "news.ycombinator.com"),
        is("Hacker News", SOCIAL)
    );
    assert_eq!(
        host(&list, "m.youtube.com"),
        is("YouTube", Some(Category::Video))
    );
    assert_eq!(
        host(&list, "chatgpt.com"),
        is("ChatGPT", Some(Category::AiAssistant))
    );
    assert_eq!(
        host(&list, "www.amazon.co.uk"),
        is("Amazon", Some(Category::Shopping))
    );
    assert_eq!(host(&list, "en.m.wikipedia.org"), is("Wikipedia", None));
    assert_eq!(host(&list, "ntp.msn.com"), is("Bing", SEARCH));
    assert_eq!(host(&list, "www.msn.com"), is("MSN", None));
}

#[test]
fn a_shared_suffix_or_a_name_elsewhere_is_no_match() {
    let list = SourceList::bundled();
    for h in [
        // Ends like a listed host, but is another domain.
        "evilgoogle.com",
        "notfacebook.com",
        "at.co",
        // Holds a listed name under another domain: only a listed host and its subdomains
        // match, never a listed name elsewhere.
        "google.evil.com",
        "google.com.evil.net",
        "facebook.com.example",
        "ycombinator.com",
        // Single labels and nothing at all.
        "google",
        "com",
        "localhost",
        "",
        ".",
        "[2001:db8::1]:8080",
        "192.0.2.1",
    ] {
        assert_eq!(host(&list, h), None, "{h}");
    }
}

#[test]
fn names_and_aliases_match_case_insensitively() {
    let list = SourceList::bundled();
    assert_eq!(name(&list, "google"), is("Google", SEARCH));
    assert_eq!(name(&list, "GOOGLE"), is("Google", SEARCH));
    assert_eq!(name(&list, " Google "), is("Google", SEARCH));
    assert_eq!(name(&list, "adwords"), is("Google", SEARCH));
    assert_eq!(name(&list, "fb"), is("Facebook", SOCIAL));
    assert_eq!(name(&list, "Facebook"), is("Facebook", SOCIAL));
    assert_eq!(name(&list, "IG"), is("Instagram", SOCIAL));
    assert_eq!(name(&list, "x"), is("Twitter", SOCIAL));
    assert_eq!(name(&list, "twitter"), is("Twitter", SOCIAL));
    assert_eq!(name(&list, "linkedin"), is("LinkedIn", SOCIAL));
    assert_eq!(name(&list, "hn"), is("Hacker News", SOCIAL));
    assert_eq!(name(&list, "hacker news"), is("Hacker News", SOCIAL));
    assert_eq!(name(&list, "reddit"), is("Reddit", SOCIAL));
    assert_eq!(name(&list, "youtube"), is("YouTube", Some(Category::Video)));
    assert_eq!(name(&list, "yt"), is("YouTube", Some(Category::Video)));
    assert_eq!(name(&list, "bing"), is("Bing", SEARCH));
    assert_eq!(name(&list, "duckduckgo"), is("DuckDuckGo", SEARCH));
    assert_eq!(name(&list, "yahoo"), is("Yahoo!", SEARCH));
    assert_eq!(
        name(&list, "chatgpt"),
        is("ChatGPT", Some(Category::AiAssistant))
    );
    assert_eq!(name(&list, "mastodon"), is("Mastodon", SOCIAL));
    // A tag that is a host: looked up as one.
    assert_eq!(
        name(&list, "chatgpt.com"),
        is("ChatGPT", Some(Category::AiAssistant))
    );
    assert_eq!(
        name(&list, "news.ycombinator.com"),
        is("Hacker News", SOCIAL)
    );
    // Mediums and unknown tags are not sources.
    for tag in [
        "newsletter",
        "email",
        "cpc",
        "my-blog",
        "",
        "googlex",
        "blog.example",
    ] {
        assert_eq!(name(&list, tag), None, "{tag:?}");
    }
}

#[test]
fn bad_rows_are_refused_with_their_line() {
    let ok = "google.com\tGoogle\tsearch\n";
    assert!(SourceList::parse(ok, "").is_ok());
    for (sources, aliases, why) in [
        ("google.com\tGoogle\n", "", "not three"),
        ("google.com\tGoogle\tsearch\textra\n", "", "not three"),
        ("google.com\tGoogle\tsearching\n", "", "unknown category"),
        ("com\tDot Com\t\n", "", "host"),
        ("www.google.com\tGoogle\tsearch\n", "", "host"),
        ("Google.com\tGoogle\tsearch\n", "", "host"),
        ("goo gle.com\tGoogle\tsearch\n", "", "host"),
        ("google..com\tGoogle\tsearch\n", "", "host"),
        ("google.com\t\tsearch\n", "", "name"),
        ("google.com\t Google\tsearch\n", "", "name"),
        ("google.com\tGoo\u{7}gle\tsearch\n", "", "name"),
        (
            "google.com\tGoogle\tsearch\ngoogle.com\tGoogle\tsearch\n",
            "",
            "once",
        ),
        (
            "google.com\tGoogle\tsearch\ngoogle.de\tGoogle\tsocial\n",
            "",
            "one category",
        ),
        (
            "google.com\tGoogle\tsearch\ngoogle.de\tGOOGLE\tsearch\n",
            "",
            "one way",
        ),
        (ok, "Goog\tGoogle\tsearch\n", "lower-case"),
        (ok, "google\tGoogle\tsearch\n", "own spelling"),
        (ok, "goog\tGoogle\tsocial\n", "one category"),
        (ok, "google.com\tGoogle\tsearch\n", "host"),
        (ok, "goog\tGoogle\tsearch\ngoog\tGoogle\tsearch\n", "once"),
    ] {
        let bad = SourceList::parse(sources, aliases).expect_err(why);
        assert!(bad.why.contains(why), "{sources:?} {aliases:?}: {bad}");
        assert!(bad.line >= 1);
    }
    // The bundled reading skips a bad row and keeps the rest.
    let list = SourceList::read("google.com\tGoogle\tsearch\ncom\tX\t\n", "");
    assert_eq!(list.skipped().len(), 1);
    assert_eq!(host(&list, "www.google.com"), is("Google", SEARCH));
}

/// A landing: the page's URL (its campaign tags) and the referrer as `core::hit` stores it.
fn land(url: &str, referrer: Option<&str>) -> SourceDims {
    let url = url::Url::parse(url).expect("url");
    classify_source(referrer, &Campaign::of(&url), &SourceList::bundled())
}

#[test]
fn realistic_landings_get_their_source_and_channel() {
    // (landing URL, referrer, source, channel, utm_medium as stored)
    let cases: &[(&str, Option<&str>, &str, &str, &str)] = &[
        (
            "https://s.example/",
            Some("https://www.google.com/"),
            "Google",
            "Organic Search",
            "",
        ),
        (
            "https://s.example/",
            Some("https://www.google.co.uk/"),
            "Google",
            "Organic Search",
            "",
        ),
        (
            "https://s.example/?gclid=Cj0K",
            Some("https://www.google.com/"),
            "Google",
            "Paid Search",
            "(gclid)",
        ),
        (
            "https://s.example/?msclkid=abc",
            Some("https://www.bing.com/"),
            "Bing",
            "Paid Search",
            "(msclkid)",
        ),
        (
            "https://s.example/",
            Some("https://duckduckgo.com/"),
            "DuckDuckGo",
            "Organic Search",
            "",
        ),
        (
            "https://s.example/",
            Some("android-app://com.google.android.googlequicksearchbox/"),
            "Google",
            "Organic Search",
            "",
        ),
        (
            "https://s.example/?utm_source=google&utm_medium=cpc",
            None,
            "Google",
            "Paid Search",
            "cpc",
        ),
        (
            "https://s.example/",
            Some("https://t.co/"),
            "Twitter",
            "Organic Social",
            "",
        ),
        (
            "https://s.example/",
            Some("https://l.facebook.com/"),
            "Facebook",
            "Organic Social",
            "",
        ),
        (
            "https://s.example/?utm_source=fb&utm_medium=paid_social",
            None,
            "Facebook",
            "Paid Social",
            "paid_social",
        ),
        (
            "https://s.example/?utm_source=facebook_ads",
            None,
            "Facebook",
            "Paid Social",
            "",
        ),
        (
            "https://s.example/",
            Some("https://news.ycombinator.com/item"),
            "Hacker News",
            "Organic Social",
            "",
        ),
        (
            "https://s.example/?ref=hn",
            None,
            "Hacker News",
            "Organic Social",
            "",
        ),
        (
            "https://s.example/",
            Some("https://old.reddit.com/r/rust/comments/x"),
            "Reddit",
            "Organic Social",
            "",
        ),
        (
            "https://s.example/",
            Some("https://lnkd.in/"),
            "LinkedIn",
            "Organic Social",
            "",
        ),
        (
            "https://s.example/",
            Some("https://m.youtube.com/"),
            "YouTube",
            "Organic Video",
            "",
        ),
        (
            "https://s.example/",
            Some("https://mail.google.com/"),
            "Gmail",
            "Email",
            "",
        ),
        (
            "https://s.example/",
            Some("https://chatgpt.com/"),
            "ChatGPT",
            "AI Assistants",
            "",
        ),
        (
            "https://s.example/?utm_source=chatgpt.com",
            None,
            "ChatGPT",
            "AI Assistants",
            "",
        ),
        (
            "https://s.example/",
            Some("https://www.perplexity.ai/"),
            "Perplexity",
            "AI Assistants",
            "",
        ),
        (
            "https://s.example/?utm_source=newsletter&utm_medium=email",
            None,
            "newsletter",
            "Email",
            "email",
        ),
        (
            "https://s.example/",
            Some("https://www.amazon.de/"),
            "Amazon",
            "Organic Shopping",
            "",
        ),
        (
            "https://s.example/",
            Some("https://en.wikipedia.org/wiki/Rust"),
            "Wikipedia",
            "Referral",
            "",
        ),
        (
            "https://s.example/",
            Some("https://blog.example/post/"),
            "blog.example",
            "Referral",
            "",
        ),
        (
            "https://s.example/",
            Some("https://www.evilgoogle.com/"),
            "evilgoogle.com",
            "Referral",
            "",
        ),
        (
            "https://s.example/?utm_source=Mastodon",
            None,
            "Mastodon",
            "Organic Social",
            "",
        ),
        ("https://s.example/", None, "", "Direct", ""),
    ];
    let mut wrong = Vec::new();
    for &(url, referrer, source, channel, medium) in cases {
        let d = land(url, referrer);
        if (d.source.as_str(), d.channel.as_str(), d.utm_medium.as_str())
            != (source, channel, medium)
        {
            wrong.push(format!(
                "{url} from {referrer:?}: expected ({source}, {channel}, {medium:?}), got ({}, {}, {:?})",
                d.source, d.channel, d.utm_medium
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
