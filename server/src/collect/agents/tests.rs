use super::*;

/// (user agent, browser, its major, OS, its major, device hint): current browsers as they
/// identify themselves.
const CURRENT: &[(&str, &str, &str, &str, &str, &str)] = &[
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
        "Chrome",
        "131",
        "Windows",
        "10",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Windows NT 6.1; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/109.0.0.0 Safari/537.36",
        "Chrome",
        "109",
        "Windows",
        "7",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
        "Safari",
        "17",
        "iOS",
        "17",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (iPad; CPU OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
        "Safari",
        "17",
        "iOS",
        "17",
        "Tablet",
    ),
    (
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15",
        "Safari",
        "18",
        "macOS",
        "10",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
        "Chrome",
        "131",
        "macOS",
        "10",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
        "Firefox",
        "133",
        "Linux",
        "",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
        "Firefox",
        "133",
        "Ubuntu",
        "",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0",
        "Firefox",
        "133",
        "Android",
        "14",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Android 14; Tablet; rv:133.0) Gecko/133.0 Firefox/133.0",
        "Firefox",
        "133",
        "Android",
        "14",
        "Tablet",
    ),
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) FxiOS/133.0 Mobile/15E148 Safari/605.1.15",
        "Firefox",
        "133",
        "iOS",
        "18",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
        "Microsoft Edge",
        "131",
        "Windows",
        "10",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36 EdgA/131.0.0.0",
        "Microsoft Edge",
        "131",
        "Android",
        "10",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) EdgiOS/131.0.2903.68 Version/18.0 Mobile/15E148 Safari/604.1",
        "Microsoft Edge",
        "131",
        "iOS",
        "18",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/26.0 Chrome/122.0.0.0 Mobile Safari/537.36",
        "Samsung Internet",
        "26",
        "Android",
        "14",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Safari/537.36 OPR/115.0.0.0",
        "Opera",
        "115",
        "Windows",
        "10",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36 OPR/86.0.0.0",
        "Opera",
        "86",
        "Android",
        "10",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
        "Chrome",
        "131",
        "Chrome OS",
        "14541",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Linux; arm_64; Android 14; SM-A546B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/128.0.0.0 YaBrowser/24.10.5.83.00 SA/3 Mobile Safari/537.36",
        "Yandex Browser",
        "24",
        "Android",
        "14",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Linux; Android 14; Pixel 8 Build/AP2A.240805.005; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/131.0.6778.39 Mobile Safari/537.36 [FB_IAB/FB4A;FBAV/490.0.0.35.79;]",
        "Facebook",
        "490",
        "Android",
        "14",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 Instagram 357.0.0.25.101 (iPhone15,2; iOS 18_1; en_US; en; scale=3.00; 1179x2556; 655203466)",
        "Instagram",
        "357",
        "iOS",
        "18",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Linux; Android 14; Pixel 8 Build/AP2A.240805.005; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/131.0.6778.39 Mobile Safari/537.36",
        "Chrome",
        "131",
        "Android",
        "14",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1",
        "Chrome",
        "131",
        "iOS",
        "18",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Linux; Android 13; SM-X710) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
        "Chrome",
        "131",
        "Android",
        "13",
        "Tablet",
    ),
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Vivaldi/7.0.3495.23",
        "Vivaldi",
        "7",
        "Windows",
        "10",
        "Desktop",
    ),
    (
        "Mozilla/5.0 (Linux; Android 14) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36 DuckDuckGo/5",
        "DuckDuckGo",
        "5",
        "Android",
        "14",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Linux; Android 12; HarmonyOS; NOH-AN00; HMSCore 6.14.0.302) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/114.0.5735.196 HuaweiBrowser/15.0.4.312 Mobile Safari/537.36",
        "Huawei Browser",
        "15",
        "Android",
        "12",
        "Mobile",
    ),
    (
        "Mozilla/5.0 (Linux; Android 11; KFTRWI) AppleWebKit/537.36 (KHTML, like Gecko) Silk/131.3.1 like Chrome/131.0.6778.200 Safari/537.36",
        "Amazon Silk",
        "131",
        "Android",
        "11",
        "Tablet",
    ),
];

#[test]
fn bundled_data_loads() {
    let parser = AgentParser::from_data(REGEXES_JSON, NAMES_TSV).expect("bundled data");
    assert!(parser.extractors.is_some());
    let regexes: serde_json::Value = serde_json::from_str(REGEXES_JSON).expect("JSON");
    for key in ["user_agent_parsers", "os_parsers"] {
        let n = regexes[key].as_array().map_or(0, Vec::len);
        assert!(n > 150, "{key}: {n} parsers");
    }
    assert!(parser.names.browsers.len() >= 10);
    assert_eq!(
        parser.names.systems.get("Mac OS X").map(String::as_str),
        Some("macOS")
    );
}

#[test]
fn current_browsers_are_named_with_their_majors() {
    let parser = AgentParser::bundled();
    let mut wrong = Vec::new();
    for &(ua, browser, browser_version, os, os_version, hint) in CURRENT {
        let expected = Agent {
            browser: browser.into(),
            browser_version: browser_version.into(),
            os: os.into(),
            os_version: os_version.into(),
            device_hint: hint,
        };
        let got = parser.parse(ua);
        if got != expected {
            wrong.push(format!("{ua}\n  expected {expected:?}\n  got      {got:?}"));
        }
        // The cached answer is the same answer.
        assert_eq!(parser.parse(ua), got);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn garbage_is_unknown_not_guessed() {
    let parser = AgentParser::bundled();
    for ua in [
        "",
        "xyzzy",
        "!!!",
        "Mozilla/5.0",
        "\u{0}\u{7}\u{1b}[31m",
        "ünïcødé ☃ 🦀",
        &"(".repeat(512),
    ] {
        assert_eq!(parser.parse(ua), Agent::default(), "{ua:?}");
    }
}

#[test]
fn versions_are_majors_of_at_most_five_digits() {
    assert_eq!(major("131"), "131");
    assert_eq!(major("14541"), "14541");
    assert_eq!(major("123456"), "");
    assert_eq!(major("XP"), "");
    assert_eq!(major("1a"), "");
    assert_eq!(major("١٢"), "");
    assert_eq!(major(""), "");
}

#[test]
fn device_hints_follow_the_documented_rules() {
    let hint = device_hint;
    assert_eq!(
        hint(
            "Mozilla/5.0 (SMART-TV; Linux; Tizen 6.0) AppleWebKit/537.36 TV Safari/537.36",
            "Tizen"
        ),
        "Desktop"
    );
    assert_eq!(
        hint(
            "Mozilla/5.0 (Linux; Android 10; BRAVIA 4K VH2 Build/QTG3; wv) Chrome/114.0 Mobile Safari/537.36",
            "Android"
        ),
        "Desktop"
    );
    assert_eq!(
        hint(
            "Mozilla/5.0 (Linux; Android 9; AFTMM Build/PS7285) Silk/120.0 like Chrome/120.0 Safari/537.36",
            "Android"
        ),
        "Desktop"
    );
    assert_eq!(
        hint(
            "Mozilla/5.0 (Windows NT 6.1; Trident/7.0; Tablet PC 2.0; rv:11.0) like Gecko",
            "Windows"
        ),
        "Desktop"
    );
    assert_eq!(
        hint("Mozilla/5.0 (iPod touch; CPU iPhone OS 15_0)", "iOS"),
        "Mobile"
    );
    assert_eq!(
        hint("Mozilla/5.0 (Windows Phone 10.0; Android 6.0.1)", ""),
        "Mobile"
    );
    assert_eq!(
        hint("Mozilla/5.0 (Linux; Android 13; SM-X710)", "Android"),
        "Tablet"
    );
    assert_eq!(hint("Mozilla/5.0 (X11; Linux x86_64)", "Linux"), "Desktop");
    assert_eq!(hint("Mozilla/5.0 (X11; SunOS i86pc)", "Solaris"), "Desktop");
    assert_eq!(hint("SomeApp/1.0", ""), "");
    // macOS by its shown name, not uap-core's: the rule reads the parser's answer.
    assert_eq!(hint("Mozilla/5.0 (Macintosh)", "Mac OS X"), "");
}

#[test]
fn name_table_rows_are_checked() {
    assert!(Names::parse("browser\tA\tB\nos\tC\tD\n# note\n\n").is_ok());
    for bad in [
        "browser\tA",
        "browser\tA\tB\tC",
        "device\tA\tB",
        "browser\t\tB",
        "browser\tA\t",
        "browser\tA\t B",
        "browser\tA\tB\nbrowser\tA\tC",
    ] {
        assert!(Names::parse(bad).is_err(), "{bad:?}");
    }
    assert!(matches!(
        AgentParser::from_data("{}", ""),
        Err(AgentDataError::Json(_))
    ));
    let broken = r#"{"user_agent_parsers":[{"regex":"(unclosed"}],"os_parsers":[]}"#;
    assert!(matches!(
        AgentParser::from_data(broken, ""),
        Err(AgentDataError::Regex(_))
    ));
}

#[test]
fn the_parser_is_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<AgentParser>();
    let parser = AgentParser::bundled();
    let (ua, browser, ..) = CURRENT[0];
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| assert_eq!(parser.parse(ua).browser, browser));
        }
    });
}

#[test]
fn the_cache_is_bounded_under_a_flood_of_distinct_agents() {
    let parser = AgentParser::bundled();
    for i in 0..100_000 {
        parser.parse(&format!("Flood/{i}"));
        if i % 997 == 0 {
            let cache = parser.lock();
            assert!(
                cache.entries() <= CACHE_ENTRIES,
                "{} entries",
                cache.entries()
            );
            assert!(cache.bytes() <= CACHE_BYTES, "{} bytes", cache.bytes());
        }
    }
    let cache = parser.lock();
    assert!(cache.entries() <= CACHE_ENTRIES && cache.bytes() <= CACHE_BYTES);
    assert!(
        cache.entries() > 1000,
        "the cache still holds recent agents"
    );
}

#[test]
fn the_cache_bytes_are_bounded_under_a_flood_of_long_agents() {
    // The parser's regexes are slow on long agents in a debug build: the cache alone.
    let mut cache = Cache::default();
    let long = "x".repeat(500);
    let answer = Agent {
        browser: "Samsung Internet".into(),
        browser_version: "26".into(),
        os: "Android".into(),
        os_version: "14".into(),
        device_hint: "Mobile",
    };
    for i in 0..100_000 {
        cache.insert(&format!("{i} {long}"), answer.clone());
        assert!(cache.bytes() <= CACHE_BYTES, "{} bytes", cache.bytes());
        assert!(cache.entries() <= CACHE_ENTRIES);
    }
    assert!(
        cache.entries() < CACHE_ENTRIES,
        "the byte bound binds first"
    );
}

#[test]
fn agents_in_use_survive_a_rotation() {
    let mut cache = Cache::default();
    let agent = Agent {
        browser: "Chrome".into(),
        ..Agent::default()
    };
    cache.insert("kept", agent.clone());
    for i in 0..Cache::ENTRIES_PER_GENERATION * 3 {
        cache.insert(&format!("one-off {i}"), Agent::default());
        if i % 1000 == 0 {
            assert_eq!(cache.get("kept"), Some(agent.clone()));
        }
    }
    assert_eq!(cache.get("kept"), Some(agent));
    assert_eq!(cache.get("one-off 0"), None);
    // An answer larger than a whole generation is not kept.
    cache.insert(&"y".repeat(Cache::BYTES_PER_GENERATION), Agent::default());
    assert!(cache.bytes() <= CACHE_BYTES);
}

/// Figures for ARCHITECTURE.md and the commit: build time and memory of the bundled parser,
/// per-agent parse time the first time a thread sees an agent (cold), again (warm), and a cache
/// hit. Run in release:
/// `cargo test --release -p tally --lib collect::agents::tests::figures -- --ignored --nocapture`
#[test]
#[ignore = "prints measurements; run by hand in release"]
fn figures() {
    use std::hint::black_box;
    use std::time::Instant;
    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    }
    let before = rss_kib();
    let started = Instant::now();
    let parser = AgentParser::bundled();
    let built = started.elapsed();
    let after = rss_kib();
    let agents: Vec<&str> = CURRENT.iter().map(|c| c.0).collect();
    let n = agents.len() as f64;
    let started = Instant::now();
    for ua in &agents {
        black_box(parser.parse_uncached(ua));
    }
    let cold = started.elapsed().as_secs_f64() / n;
    let rounds = 2000;
    let started = Instant::now();
    for _ in 0..rounds {
        for ua in &agents {
            black_box(parser.parse_uncached(ua));
        }
    }
    let warm = started.elapsed().as_secs_f64() / (n * f64::from(rounds));
    for ua in &agents {
        parser.parse(ua);
    }
    let started = Instant::now();
    for _ in 0..rounds {
        for ua in &agents {
            black_box(parser.parse(ua));
        }
    }
    let hit = started.elapsed().as_secs_f64() / (n * f64::from(rounds));
    let rss_end = rss_kib();
    println!(
        "build {:.1} ms; RSS {before} -> {after} kB (+{} kB), {rss_end} kB after parsing",
        built.as_secs_f64() * 1e3,
        after.saturating_sub(before),
    );
    println!(
        "{} agents: cold {:.1} µs, warm {:.2} µs, cache hit {:.3} µs per agent",
        agents.len(),
        cold * 1e6,
        warm * 1e6,
        hit * 1e6
    );
}
