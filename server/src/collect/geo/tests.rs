use std::io::Write as _;

use mmdb_writer::{IpVersion, Ipv4Aliasing, Value, Writer};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn at(country: &str, region: &str) -> Option<Location> {
    Some(Location {
        country: country.into(),
        region: region.into(),
    })
}

fn insert(w: &mut Writer, net: &str, value: Value) {
    let net: ipnet::IpNet = net.parse().expect("a network");
    w.insert_value(net, value).expect("insert");
}

/// A MaxMind GeoIP2-City-like record: names, ids and other fields beside the codes.
fn maxmind(country: &str, subdivision: Option<&str>) -> Value {
    let named = |code: &str| {
        Value::map([
            ("geoname_id", Value::from(2_635_167_u32)),
            ("iso_code", Value::from(code)),
            (
                "names",
                Value::map([
                    ("en", Value::from("Somewhere")),
                    ("de", Value::from("Irgendwo")),
                ]),
            ),
        ])
    };
    let mut fields = vec![
        ("continent", Value::map([("code", Value::from("EU"))])),
        ("country", named(country)),
        ("registered_country", named("SE")),
    ];
    if let Some(sub) = subdivision {
        fields.push(("subdivisions", Value::array([named(sub), named("XXX")])));
    }
    Value::map(fields)
}

/// A DB-IP / ip-location-db lite record.
fn dbip(country: &str) -> Value {
    Value::map([("country_code", Value::from(country))])
}

/// A small MaxMind-layout database (IPv6 tree, IPv4 aliased, like MaxMind's files).
fn maxmind_db() -> Vec<u8> {
    let mut w = Writer::builder("GeoIP2-City")
        .description(&[("en", "GeoIP2 City Test Database")])
        .build();
    insert(&mut w, "81.2.69.0/24", maxmind("GB", Some("ENG")));
    insert(&mut w, "2001:db8::/32", maxmind("US", Some("md")));
    insert(&mut w, "192.0.2.0/24", maxmind("de", None));
    insert(&mut w, "203.0.113.0/24", maxmind("ZZ", None));
    insert(
        &mut w,
        "198.18.0.0/15",
        Value::map([("asn", Value::from(64_512_u32))]),
    );
    w.to_bytes().expect("a database")
}

/// A small DB-IP-layout database: no IPv4 aliases (as ip-location-db's files), or IPv4 only.
fn dbip_db(version: IpVersion, country: &str) -> Vec<u8> {
    let mut w = Writer::builder("country ipvAll")
        .ip_version(version)
        .ipv4_aliasing(Ipv4Aliasing::Disabled)
        .build();
    insert(&mut w, "198.51.100.0/24", dbip(country));
    insert(&mut w, "192.0.2.0/25", dbip("DE"));
    if version == IpVersion::V6 {
        insert(&mut w, "2001:db8:1::/48", dbip("BR"));
    }
    w.to_bytes().expect("a database")
}

/// `bytes` written whole to `dir/name`, then renamed over it (how a file is replaced).
fn install(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    let mut tmp = tempfile::NamedTempFile::new_in(dir).expect("temp file");
    tmp.write_all(bytes).expect("write");
    tmp.persist(&path).expect("rename");
    path
}

#[test]
fn the_maxmind_layout_gives_country_and_region() {
    let dir = tempfile::tempdir().expect("dir");
    let geo = Geo::open(install(dir.path(), "GeoIP2-City.mmdb", &maxmind_db())).expect("open");
    assert_eq!(geo.lookup(ip("81.2.69.160")), at("GB", "GB-ENG"));
    assert_eq!(geo.lookup(ip("2001:db8::5")), at("US", "US-MD"));
    assert_eq!(geo.lookup(ip("192.0.2.7")), at("DE", ""));
    // MaxMind's files alias IPv4-mapped addresses too; canonical or not, the same answer.
    assert_eq!(geo.lookup(ip("::ffff:81.2.69.160")), at("GB", "GB-ENG"));
    assert!(!geo.is_dbip());
    assert_eq!(geo.database_description(), "GeoIP2 City Test Database");
}

#[test]
fn the_dbip_layout_gives_country_only() {
    let dir = tempfile::tempdir().expect("dir");
    let path = install(
        dir.path(),
        "dbip-country.mmdb",
        &dbip_db(IpVersion::V6, "JP"),
    );
    let geo = Geo::open(path).expect("open");
    assert_eq!(geo.lookup(ip("198.51.100.1")), at("JP", ""));
    assert_eq!(geo.lookup(ip("2001:db8:1::1")), at("BR", ""));
    assert!(geo.is_dbip(), "named by its file");
    assert_eq!(geo.database_description(), "country ipvAll");
}

#[test]
fn misses_are_none() {
    let dir = tempfile::tempdir().expect("dir");
    let geo = Geo::open(install(dir.path(), "a.mmdb", &maxmind_db())).expect("open");
    for addr in [
        "10.0.0.1",
        "127.0.0.1",
        "::1",
        "8.8.8.8",
        "2a00:1450:4001::1",
        // "ZZ": unknown; a record of neither layout.
        "203.0.113.9",
        "198.18.0.1",
    ] {
        assert_eq!(geo.lookup(ip(addr)), None, "{addr}");
    }
}

#[test]
fn ipv4_mapped_addresses_are_looked_up_as_ipv4() {
    let dir = tempfile::tempdir().expect("dir");
    let path = install(dir.path(), "dbip.mmdb", &dbip_db(IpVersion::V6, "JP"));
    let geo = Geo::open(path).expect("open");
    // The file has no alias: only canonicalising finds the IPv4 record.
    assert_eq!(geo.lookup(ip("::ffff:198.51.100.7")), at("JP", ""));
    assert_eq!(geo.lookup(ip("::ffff:192.0.2.1")), at("DE", ""));
}

#[test]
fn ipv6_in_an_ipv4_only_file_is_a_miss() {
    let dir = tempfile::tempdir().expect("dir");
    let path = install(dir.path(), "v4.mmdb", &dbip_db(IpVersion::V4, "JP"));
    let geo = Geo::open(path).expect("open");
    assert_eq!(geo.lookup(ip("198.51.100.1")), at("JP", ""));
    assert_eq!(geo.lookup(ip("::ffff:198.51.100.1")), at("JP", ""));
    assert_eq!(geo.lookup(ip("2001:db8:1::1")), None);
}

#[test]
fn a_replaced_file_is_picked_up_without_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let path = install(dir.path(), "geo.mmdb", &dbip_db(IpVersion::V6, "JP"));
    let geo = Geo::open(&path).expect("open");
    assert!(!geo.refresh_if_changed().expect("unchanged"));
    assert_eq!(geo.lookup(ip("198.51.100.1")), at("JP", ""));

    install(dir.path(), "geo.mmdb", &dbip_db(IpVersion::V6, "FR"));
    assert!(geo.refresh_if_changed().expect("reloaded"));
    assert_eq!(geo.lookup(ip("198.51.100.1")), at("FR", ""));
    assert!(!geo.refresh_if_changed().expect("unchanged"));

    // Another layout in its place works too.
    install(dir.path(), "geo.mmdb", &maxmind_db());
    assert!(geo.refresh_if_changed().expect("reloaded"));
    assert_eq!(geo.lookup(ip("81.2.69.160")), at("GB", "GB-ENG"));
    assert_eq!(geo.lookup(ip("198.51.100.1")), None);
}

#[test]
fn a_corrupt_replacement_keeps_the_loaded_database() {
    let dir = tempfile::tempdir().expect("dir");
    let good = dbip_db(IpVersion::V6, "JP");
    let path = install(dir.path(), "geo.mmdb", &good);
    let geo = Geo::open(&path).expect("open");
    let replacements: [&[u8]; 3] = [
        b"not a database at all",
        &good[..good.len() / 2],
        &[0u8; 4096],
    ];
    for bad in replacements {
        install(dir.path(), "geo.mmdb", bad);
        assert!(matches!(
            geo.refresh_if_changed(),
            Err(GeoError::Database { .. })
        ));
        assert_eq!(geo.lookup(ip("198.51.100.1")), at("JP", ""), "the old one");
        // Reported once: the same bad file is not read again.
        assert!(!geo.refresh_if_changed().expect("no change"));
    }
    // A missing file: once, and the old database stays.
    fs::remove_file(&path).expect("remove");
    assert!(matches!(geo.refresh_if_changed(), Err(GeoError::Io { .. })));
    assert!(!geo.refresh_if_changed().expect("still missing"));
    assert_eq!(geo.lookup(ip("198.51.100.1")), at("JP", ""));
    // A good file again.
    install(dir.path(), "geo.mmdb", &dbip_db(IpVersion::V6, "IT"));
    assert!(geo.refresh_if_changed().expect("reloaded"));
    assert_eq!(geo.lookup(ip("198.51.100.1")), at("IT", ""));
}

#[test]
fn opening_a_missing_or_foreign_file_fails() {
    let dir = tempfile::tempdir().expect("dir");
    assert!(matches!(
        Geo::open(dir.path().join("absent.mmdb")),
        Err(GeoError::Io { .. })
    ));
    let path = install(dir.path(), "text.mmdb", b"hello");
    let error = Geo::open(path).expect_err("not a database");
    assert!(matches!(error, GeoError::Database { .. }));
    assert!(error.to_string().contains("text.mmdb"), "{error}");
}

#[test]
fn dbip_data_is_recognised_by_metadata_or_file_name() {
    let dir = tempfile::tempdir().expect("dir");
    let mut w = Writer::builder("DBIP-Country-Lite")
        .description(&[("en", "IP to Country Lite by DB-IP")])
        .build();
    insert(&mut w, "198.51.100.0/24", maxmind("JP", None));
    let path = install(dir.path(), "country.mmdb", &w.to_bytes().expect("bytes"));
    let geo = Geo::open(path).expect("open");
    assert!(geo.is_dbip());
    assert_eq!(geo.database_description(), "IP to Country Lite by DB-IP");
    let path = install(
        dir.path(),
        "geo-whois-asn-country.mmdb",
        &dbip_db(IpVersion::V6, "JP"),
    );
    assert!(!Geo::open(path).expect("open").is_dbip());
}

#[test]
fn codes_are_checked() {
    assert_eq!(country_code("de").as_deref(), Some("DE"));
    for bad in ["", "D", "DEU", "ZZ", "xx", "D1", "ÄÖ"] {
        assert_eq!(country_code(bad), None, "{bad:?}");
    }
    assert_eq!(subdivision_code("md").as_deref(), Some("MD"));
    assert_eq!(subdivision_code("ENG").as_deref(), Some("ENG"));
    assert_eq!(subdivision_code("01").as_deref(), Some("01"));
    for bad in ["", "ABCD", "A-B", "É"] {
        assert_eq!(subdivision_code(bad), None, "{bad:?}");
    }
}

#[test]
fn geo_is_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Geo>();
}

/// The real DB-IP country file (`scripts/fetch-geoip.sh DIR` installs it), at the path in
/// `TALLY_TEST_GEOIP`. Without it the test skips loudly, except under `CI=true`, where it
/// must run.
#[test]
fn the_real_dbip_country_file() {
    let Some(path) = std::env::var_os("TALLY_TEST_GEOIP").filter(|p| !p.is_empty()) else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        assert!(
            !ci,
            "CI=true but TALLY_TEST_GEOIP is not set (scripts/fetch-geoip.sh DIR, then \
             TALLY_TEST_GEOIP=DIR/dbip-country.mmdb): this test must run in CI"
        );
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: set TALLY_TEST_GEOIP to a DB-IP country file (scripts/fetch-geoip.sh DIR \
             installs DIR/dbip-country.mmdb) to run this test"
        );
        return;
    };
    let geo = Geo::open(PathBuf::from(path)).expect("the DB-IP country file opens");
    assert!(geo.is_dbip());
    // Long-held allocations, stable across monthly editions.
    assert_eq!(
        geo.lookup(ip("8.8.8.8")).map(|l| l.country),
        Some("US".into())
    );
    assert_eq!(
        geo.lookup(ip("85.214.132.117")).map(|l| l.country),
        Some("DE".into())
    );
    assert_eq!(
        geo.lookup(ip("::ffff:85.214.132.117")).map(|l| l.country),
        Some("DE".into())
    );
    assert!(geo.lookup(ip("2a00:1450:4001:80b::200e")).is_some());
    for private in ["127.0.0.1", "10.1.2.3", "192.168.0.1", "::1", "fe80::1"] {
        assert_eq!(geo.lookup(ip(private)), None, "{private}");
    }
}

/// Figures for the commit and ARCHITECTURE.md: opening the real file, its memory, a lookup.
/// `TALLY_TEST_GEOIP=DIR/dbip-country.mmdb cargo test --release -p tally --lib
/// collect::geo::tests::figures -- --ignored --nocapture`
#[test]
#[ignore = "prints measurements; run by hand in release with TALLY_TEST_GEOIP"]
fn figures() {
    use std::hint::black_box;
    use std::time::Instant;
    let path = PathBuf::from(std::env::var_os("TALLY_TEST_GEOIP").expect("TALLY_TEST_GEOIP"));
    let rss_kib = || {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    let before = rss_kib();
    let started = Instant::now();
    let geo = Geo::open(&path).expect("open");
    let opened = started.elapsed();
    let after = rss_kib();
    // Random addresses (xorshift), IPv4 then IPv6 under 2a00::/16.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let n = 1_000_000u32;
    let v4: Vec<IpAddr> = (0..n)
        .map(|_| IpAddr::from(std::net::Ipv4Addr::from(next() as u32)))
        .collect();
    let v6: Vec<IpAddr> = (0..n)
        .map(|_| {
            IpAddr::from(std::net::Ipv6Addr::from(
                (0x2a00u128 << 112) | (u128::from(next()) << 48),
            ))
        })
        .collect();
    let time = |ips: &[IpAddr]| {
        let started = Instant::now();
        let found = ips
            .iter()
            .filter(|ip| black_box(geo.lookup(**ip)).is_some())
            .count();
        (started.elapsed().as_secs_f64() * 1e9 / f64::from(n), found)
    };
    let (ns4, found4) = time(&v4);
    let (ns6, found6) = time(&v6);
    install(
        path.parent().expect("dir"),
        ".figures-copy.mmdb",
        &fs::read(&path).expect("read"),
    );
    let copy = Geo::open(path.with_file_name(".figures-copy.mmdb")).expect("copy");
    install(
        path.parent().expect("dir"),
        ".figures-copy.mmdb",
        &fs::read(&path).expect("read"),
    );
    let started = Instant::now();
    assert!(copy.refresh_if_changed().expect("reload"));
    let reload = started.elapsed();
    fs::remove_file(path.with_file_name(".figures-copy.mmdb")).expect("remove");
    println!(
        "{}: open {:.1} ms, RSS +{} kB; lookup {ns4:.0} ns IPv4 ({found4} found), {ns6:.0} ns \
         IPv6 ({found6} found); reload {:.1} ms",
        geo.database_description(),
        opened.as_secs_f64() * 1e3,
        after.saturating_sub(before),
        reload.as_secs_f64() * 1e3
    );
}
