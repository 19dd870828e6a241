//! The `tally` command: parses configuration and hands over to the library.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tally::core::clock::SystemClock;
use tally::core::day::SiteZone;
use tally::core::ids::{PagePath, SiteId};
use tally::ops::config::{FileConfig, ServeArgs, ServeConfig};
use tally::store::Site;

/// jemalloc instead of glibc's allocator: per-thread caches without glibc's fastbin
/// consolidation, which took ~13 % of the collector's CPU under the realistic mix.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "tally",
    version,
    about = "Self-hosted visit counter and web analytics collector"
)]
struct Cli {
    /// SQLite database file, or a PostgreSQL URL (`postgres://user@host:5432/db`): the scheme
    /// chooses. Every command works on both (`copy-to` reads a SQLite file).
    #[arg(long, global = true, env = "TALLY_DB")]
    db: Option<PathBuf>,
    /// Optional TOML config file (keys as the long flags: listen, auto-sites, db, ...).
    #[arg(long, global = true, env = "TALLY_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the collector.
    Serve(Box<ServeArgs>),
    /// Manage sites.
    #[command(subcommand)]
    Site(SiteCommand),
    /// Recount counters from raw events and report drift. Safe while collectors run: a
    /// repair goes site by site, and each site's commits wait for that site's recount only.
    Verify {
        /// Replace drifted counters with the recount.
        #[arg(long)]
        repair: bool,
        /// Only this site (other sites' commits never wait for it on PostgreSQL).
        #[arg(long)]
        site: Option<String>,
    },
    /// Import history (server logs, GoatCounter, Plausible, a dead counter's numbers, a Tally
    /// daily export). Safe to run twice and while `tally serve` runs on the same database.
    Import {
        /// Input format.
        #[arg(long, value_enum)]
        format: tally::ops::import::Format,
        /// The site to count into (must exist: `tally site add`).
        #[arg(long)]
        site: String,
        /// Only lines for this host (Caddy request host, vhost of a combined line, Plausible
        /// hostname).
        #[arg(long)]
        host: Option<String>,
        /// Where lines that were not imported go, with the reason [default: INPUT.rejects].
        #[arg(long)]
        reject: Option<PathBuf>,
        /// Records per commit (small batches keep live traffic fast).
        #[arg(long, default_value_t = 50)]
        batch: usize,
        /// Pause after each batch, as a multiple of the time it held the database writer.
        #[arg(long, default_value_t = 2.0)]
        pause: f64,
        /// A location database in MaxMind's format, as `tally serve --geoip` takes it: the
        /// country (and region) of each log line's client address. Without it (and without
        /// `geoip` in the config file) countries of imported lines are unknown.
        #[arg(long, env = "TALLY_GEOIP")]
        geoip: Option<PathBuf>,
        /// The file to import.
        input: PathBuf,
    },
    /// Export a site's data to stdout, streamed.
    Export {
        #[arg(long)]
        site: String,
        /// First day (YYYY-MM-DD) [default: the first].
        #[arg(long)]
        from: Option<jiff::civil::Date>,
        /// Last day (YYYY-MM-DD) [default: the last].
        #[arg(long)]
        to: Option<jiff::civil::Date>,
        #[arg(long, value_enum, default_value = "csv")]
        format: tally::ops::export::ExportFormat,
        #[arg(long, value_enum, default_value = "daily")]
        what: tally::ops::export::ExportWhat,
    },
    /// Write a consistent copy of the database to FILE (safe while `tally serve` runs). On
    /// PostgreSQL: `pg_dump --format=custom` of Tally's schema, restored with the
    /// `pg_restore` command it prints.
    Backup {
        /// The new file (never overwritten).
        file: PathBuf,
    },
    /// Copy every table of this SQLite database (sites, counters, visitor sets, raw events,
    /// salts) into an EMPTY PostgreSQL database, in one transaction, then verify it there.
    /// Stop `tally serve` first: hits it acknowledges after the copy are not in PostgreSQL.
    CopyTo {
        /// The PostgreSQL URL (`postgres://user@host/db`; `?options=-csearch_path%3Dname` for
        /// a schema other than `public`).
        url: String,
    },
}

#[derive(Subcommand)]
enum SiteCommand {
    /// Add (or replace) a site.
    Add {
        id: String,
        /// Allowed origin (repeat for several), e.g. https://blog.example.com; `*` for any.
        #[arg(long = "origin", required = true)]
        origins: Vec<String>,
        /// IANA time zone of the site's days.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Make the site's stats public.
        #[arg(long)]
        public: bool,
    },
    /// List sites.
    List,
    /// Print the site's ingest key (creating one if it has none), or replace it with --rotate.
    /// Server-side senders send it as `Authorization: Bearer <key>` and are exempt from the
    /// per-address limits.
    Key {
        id: String,
        /// Replace the key with a new one (the old one stops working within 5 s).
        #[arg(long)]
        rotate: bool,
    },
    /// Remove a site's configuration (its counts stay in the database) and revoke its shared
    /// links.
    Remove { id: String },
    /// Make a shared read-only link to the site's dashboard and stats API; prints its id and URL.
    Share {
        id: String,
        /// Days until the link stops working [default: never].
        #[arg(long)]
        expires: Option<u32>,
        /// Protect the link with a password, read from TALLY_SHARE_PASSWORD or else one line
        /// of stdin (never from the command line, which `ps` shows).
        #[arg(long)]
        password: bool,
        /// The server's public base URL (https://stats.example.com) to print the link under;
        /// also `public-url` in the config file.
        #[arg(long, env = "TALLY_PUBLIC_URL")]
        url: Option<String>,
    },
    /// List a site's shared links: id, created, expires, password.
    Shares { id: String },
    /// Revoke shared links at once on every collector: a link id (`sh_…`), or a site (all of
    /// its links).
    Unshare { target: String },
    /// Carry numbers over from a counter that shut down (busuanzi, hit counters): added to
    /// every shown total, never mixed into the raw-event recount.
    SetBase {
        id: String,
        /// A page path (`/posts/a`); without it the base is the whole site's.
        #[arg(long)]
        page: Option<String>,
        #[arg(long)]
        views: u64,
        #[arg(long, default_value_t = 0)]
        visitors: u64,
    },
    /// Email reports of a site: without an action, list them; with --to and --every, add one
    /// (sent by `tally serve --smtp …` once each week or month has ended); --stop removes it;
    /// --now sends the last ended week or month at once.
    Report(Box<ReportArgs>),
}

#[derive(clap::Args)]
struct ReportArgs {
    id: String,
    /// The recipient's address.
    #[arg(long)]
    to: Option<String>,
    /// week (Monday to Sunday) or month, in the site's time zone.
    #[arg(long, value_parser = ["week", "month"])]
    every: Option<String>,
    /// Send the last ended period now (with --every, default week); the schedule is untouched.
    #[arg(long, conflicts_with = "stop")]
    now: bool,
    /// Remove the schedule of --to and --every.
    #[arg(long)]
    stop: bool,
    #[command(flatten)]
    mail: tally::ops::config::MailArgs,
}

fn main() -> anyhow::Result<()> {
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("TALLY_LOG")
        .unwrap_or_else(|_| "info,tower_http=warn".into());
    // No client address in any log at any level: these targets log peer addresses at trace
    // level, so they stay off whatever TALLY_LOG says.
    let mut quiet = vec!["axum::serve=off"];
    // The HTTP/2 library warns once per misbehaving connection (a rapid-reset attacker makes
    // dozens a second: a log flood it controls). Its errors only, unless TALLY_LOG names it.
    if !std::env::var("TALLY_LOG").is_ok_and(|v| v.contains("h2")) {
        quiet.push("h2=error");
    }
    for quiet in quiet {
        if let Ok(directive) = quiet.parse() {
            filter = filter.add_directive(directive);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let file = match &cli.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let args = match &cli.command {
        Command::Serve(args) => (**args).clone(),
        Command::Site(SiteCommand::Report(r)) => ServeArgs::mail_only(&r.mail),
        _ => ServeArgs::default(),
    };
    let config = ServeConfig::resolve(args, cli.db.clone(), file)?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(_) => {
                let store = tally::open_store(&config).await?;
                serve(config, store).await
            }
            Command::Site(cmd) => {
                site(cmd, &config, tally::open_store(&config).await?.as_ref()).await
            }
            Command::Verify { repair, site } => {
                let store = tally::open_store(&config).await?;
                match site {
                    None => verify(store, repair).await,
                    Some(site) => {
                        let id =
                            SiteId::parse(&site).map_err(|e| anyhow::anyhow!("{site:?}: {e}"))?;
                        let counted = store.verify_site(&id, repair).await?;
                        let rolled = verify_rollups(&store, Some(&id), repair).await?;
                        report_verify(joined(counted, rolled))
                    }
                }
            }
            Command::Import {
                format,
                site,
                host,
                reject,
                batch,
                pause,
                geoip,
                input,
            } => {
                let store = tally::open_store(&config).await?;
                let id = SiteId::parse(&site).map_err(|e| anyhow::anyhow!("{site:?}: {e}"))?;
                let site = store
                    .get_site(&id)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("no site {id} (add it with `tally site add`)"))?;
                let reject = reject.unwrap_or_else(|| {
                    let mut name = input.as_os_str().to_owned();
                    name.push(".rejects");
                    PathBuf::from(name)
                });
                let job = tally::ops::import::ImportJob {
                    format,
                    site,
                    input,
                    host,
                    reject: reject.clone(),
                    batch,
                    pause,
                    // Every event is kept raw until its day is sealed (`settle`).
                    raw_before_ms: None,
                    geoip: geoip.or_else(|| config.geoip.clone()),
                };
                let started = std::time::Instant::now();
                let r = tally::ops::import::run(store.as_ref(), &job).await?;
                let secs = started.elapsed().as_secs_f64();
                println!(
                    "read {} lines in {secs:.2} s ({:.0} lines/s): imported {}, duplicates {}, rejected {}{}",
                    r.lines,
                    r.lines as f64 / secs.max(1e-6),
                    r.imported,
                    r.duplicates,
                    r.rejected,
                    if r.rejected > 0 {
                        format!(" (reasons in {})", reject.display())
                    } else {
                        String::new()
                    }
                );
                if format.has_events() {
                    let sealed =
                        tally::ops::import::settle(store.clone(), jiff::Timestamp::now()).await?;
                    if sealed > 0 {
                        println!("sealed {sealed} finished days");
                    }
                }
                Ok(())
            }
            Command::Export {
                site,
                from,
                to,
                format,
                what,
            } => {
                let store = tally::open_store(&config).await?;
                let id = SiteId::parse(&site).map_err(|e| anyhow::anyhow!("{site:?}: {e}"))?;
                let range = (
                    from.unwrap_or(jiff::civil::date(1970, 1, 1)),
                    to.unwrap_or(jiff::civil::date(9999, 12, 31)),
                );
                let stdout = std::io::stdout();
                let mut out = std::io::BufWriter::new(stdout.lock());
                tally::ops::export::export(store, &id, range, format, what, &mut out)
                    .await?;
                Ok(())
            }
            Command::Backup { file } => match &config.db {
                tally::ops::config::Database::Sqlite(_) => {
                    tally::open_sqlite(&config)?.backup_to(&file).await?;
                    println!("backup written to {}", file.display());
                    Ok(())
                }
                tally::ops::config::Database::Postgres(url) => {
                    let store = tally::open_postgres(&config, url).await?;
                    let b = tally::ops::backup::postgres(&store, url, &file).await?;
                    println!(
                        "backup of schema {} written to {} ({} bytes, pg_dump custom format)",
                        b.schema,
                        file.display(),
                        b.bytes
                    );
                    println!(
                        "restore it (every tally process stopped, the schema absent) with:\n  {}",
                        b.restore
                    );
                    Ok(())
                }
            },
            Command::CopyTo { url } => copy_to(&config, &tally::open_sqlite(&config)?, &url).await,
        }
    })
}

async fn serve(config: ServeConfig, store: Arc<dyn tally::store::Store>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(db = %config.db, auto_sites = config.auto_sites, "starting");
    if config.metrics_token.is_none() && !addr.ip().is_loopback() {
        tracing::warn!(
            "/metrics is open to anyone who can reach this address: set --metrics-token, or \
             keep /metrics away from the internet at the proxy"
        );
    }
    println!("listening on http://{addr}");
    let shutdown = async {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(term) => term,
                    Err(_) => return std::mem::drop(ctrl_c.await),
                };
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutting down: committing queued hits");
    };
    tally::run(listener, config, store, Arc::new(SystemClock), shutdown).await
}

async fn site(
    cmd: SiteCommand,
    config: &ServeConfig,
    store: &dyn tally::store::Store,
) -> anyhow::Result<()> {
    match cmd {
        SiteCommand::Add {
            id,
            origins,
            timezone,
            public,
        } => {
            let site = Site {
                id: SiteId::parse(&id).map_err(|e| anyhow::anyhow!("{id:?}: {e}"))?,
                origins: origins
                    .iter()
                    .map(|o| normalise_origin(o))
                    .collect::<anyhow::Result<_>>()?,
                zone: SiteZone::parse(&timezone)?,
                public,
                ingest_key: None,
            };
            let before = store.get_site(&site.id).await?;
            store.put_site(&site).await?;
            match before {
                None => println!("site {} added", site.id),
                // `site add` replaces a site's settings: say what they were.
                Some(old) => println!(
                    "site {} replaced (was: origins {}, time zone {}, {}); its counts are kept",
                    site.id,
                    old.origins.join(","),
                    old.zone.name(),
                    if old.public { "public" } else { "private" },
                ),
            }
        }
        SiteCommand::List => {
            for s in store.list_sites().await? {
                let visibility = if s.public { "public" } else { "private" };
                println!(
                    "{}\t{}\t{}\t{}",
                    s.id,
                    s.zone.name(),
                    visibility,
                    s.origins.join(",")
                );
            }
        }
        SiteCommand::Key { id, rotate } => {
            let id = SiteId::parse(&id).map_err(|e| anyhow::anyhow!("{id:?}: {e}"))?;
            let site = store
                .get_site(&id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no site {id}"))?;
            let key = match site.ingest_key {
                Some(key) if !rotate => key,
                _ => {
                    let key = format!(
                        "tk_{}",
                        tally::collect::secrets::random_bytes::<24>()
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<String>()
                    );
                    anyhow::ensure!(store.set_ingest_key(&id, Some(&key)).await?, "no site {id}");
                    key
                }
            };
            println!("{key}");
        }
        SiteCommand::Remove { id } => {
            let id = SiteId::parse(&id).map_err(|e| anyhow::anyhow!("{id:?}: {e}"))?;
            if !store.remove_site(&id).await? {
                anyhow::bail!("no site {id}");
            }
            let revoked = store.revoke_site_shares(&id).await?;
            println!("site {id} removed; {revoked} shared link(s) revoked");
        }
        SiteCommand::Share {
            id,
            expires,
            password,
            url,
        } => {
            share(
                store,
                &id,
                expires,
                password,
                url.as_deref().or(config.public_url.as_deref()),
            )
            .await?
        }
        SiteCommand::Shares { id } => {
            let id = SiteId::parse(&id).map_err(|e| anyhow::anyhow!("{id:?}: {e}"))?;
            anyhow::ensure!(store.get_site(&id).await?.is_some(), "no site {id}");
            let when = |ms: i64| {
                jiff::Timestamp::from_millisecond(ms).map_or(ms.to_string(), |t| t.to_string())
            };
            for s in store.list_shares(&id).await? {
                println!(
                    "{}\t{}\t{}\t{}",
                    s.id,
                    when(s.created_ms),
                    s.expires_ms.map_or("never".to_owned(), when),
                    if s.password_hash.is_some() {
                        "password"
                    } else {
                        "no-password"
                    }
                );
            }
        }
        SiteCommand::Unshare { target } => {
            if target.starts_with("sh_") {
                anyhow::ensure!(
                    store.revoke_share(&target).await?,
                    "no shared link {target}"
                );
                println!("shared link {target} revoked");
            } else {
                let id = SiteId::parse(&target).map_err(|e| anyhow::anyhow!("{target:?}: {e}"))?;
                let n = store.revoke_site_shares(&id).await?;
                println!("{n} shared link(s) of {id} revoked");
            }
        }
        SiteCommand::SetBase {
            id,
            page,
            views,
            visitors,
        } => {
            let id = SiteId::parse(&id).map_err(|e| anyhow::anyhow!("{id:?}: {e}"))?;
            anyhow::ensure!(store.get_site(&id).await?.is_some(), "no site {id}");
            let page = page
                .map(|p| {
                    PagePath::parse(&p).map_err(|_| anyhow::anyhow!("page {p:?} must start with /"))
                })
                .transpose()?;
            store
                .set_base(&id, page.as_ref(), tally_wire::Numbers { views, visitors })
                .await?;
            let scope = page
                .as_ref()
                .map_or("the whole site".to_owned(), |p| p.as_str().to_owned());
            println!("base of {id} ({scope}) set to {views} views, {visitors} visitors");
        }
        SiteCommand::Report(r) => report(*r, config, store).await?,
    }
    Ok(())
}

async fn report(
    r: ReportArgs,
    config: &ServeConfig,
    store: &dyn tally::store::Store,
) -> anyhow::Result<()> {
    use tally::core::period::Every;
    use tally::ops::report::mail::{Mailer, parse_address};
    let id = SiteId::parse(&r.id).map_err(|e| anyhow::anyhow!("{:?}: {e}", r.id))?;
    let site = store
        .get_site(&id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no site {id}"))?;
    let every = r.every.as_deref().map(Every::parse).transpose()?;
    let to =
        r.to.as_deref()
            .map(|to| parse_address(to).map(|m| m.email.to_string()))
            .transpose()?;
    match (to, every) {
        (Some(to), every) if r.now => {
            let mail = config.mail.as_ref().ok_or_else(|| {
                anyhow::anyhow!("--now needs an SMTP relay: --smtp or TALLY_SMTP")
            })?;
            let mailer = Mailer::new(mail)?;
            let every = every.unwrap_or(Every::Week);
            let period = tally::ops::report::send_now(
                store,
                &mailer,
                &site,
                &to,
                every,
                jiff::Timestamp::now(),
            )
            .await?;
            println!("report of {id} for {} sent to {to}", period.title());
        }
        (Some(to), Some(every)) if r.stop => {
            anyhow::ensure!(
                store.remove_report(&id, &to, every).await?,
                "no {every} report of {id} to {to}"
            );
            println!("{every} report of {id} to {to} removed");
        }
        (Some(to), Some(every)) => {
            let schedule = tally::store::ReportSchedule {
                site: id.clone(),
                recipient: to.clone(),
                every,
                created_ms: jiff::Timestamp::now().as_millisecond(),
            };
            if store.add_report(&schedule).await? {
                println!(
                    "{every} report of {id} to {to} added: sent by `tally serve --smtp …` once \
                     each {every} has ended ({})",
                    site.zone.name()
                );
            } else {
                println!("{every} report of {id} to {to} exists already");
            }
        }
        (None, None) if !r.now && !r.stop => {
            for s in store.list_reports(Some(&id)).await? {
                println!("{}\t{}\t{}", s.site, s.every, s.recipient);
            }
        }
        _ => anyhow::bail!(
            "give --to ADDR --every week|month to add a report (with --stop to remove it), \
             --to ADDR --now to send one now, or nothing to list them"
        ),
    }
    Ok(())
}

/// `tally site share`: make a link, print its id and URL (the token is shown only now).
async fn share(
    store: &dyn tally::store::Store,
    id: &str,
    expires: Option<u32>,
    password: bool,
    public_url: Option<&str>,
) -> anyhow::Result<()> {
    let id = SiteId::parse(id).map_err(|e| anyhow::anyhow!("{id:?}: {e}"))?;
    anyhow::ensure!(store.get_site(&id).await?.is_some(), "no site {id}");
    let password = match password {
        false => None,
        true => Some(match std::env::var("TALLY_SHARE_PASSWORD") {
            Ok(p) if !p.is_empty() => p,
            _ => {
                let mut line = String::new();
                std::io::stdin()
                    .read_line(&mut line)
                    .context("cannot read the password from stdin")?;
                line.trim_end_matches(['\r', '\n']).to_owned()
            }
        }),
    };
    let now_ms = jiff::Timestamp::now().as_millisecond();
    let made = tally::collect::shares::new_share(&id, now_ms, expires, password.as_deref())?;
    store.create_share(&made.share).await?;
    let base = public_url.map(|u| u.trim_end_matches('/'));
    println!("{}", made.share.id);
    println!("{}", tally::edge::http::share_url(base, &made.token));
    if base.is_none() {
        eprintln!(
            "hint: this is a path on your server; give --url https://stats.example.com (or \
             TALLY_PUBLIC_URL, or public-url in the config file) to print the whole address"
        );
    }
    eprintln!("revoke it with: tally site unshare {}", made.share.id);
    Ok(())
}

/// `https://Blog.Example.com/` → `https://blog.example.com` (what browsers send as Origin).
fn normalise_origin(raw: &str) -> anyhow::Result<String> {
    if raw == "*" {
        return Ok(raw.to_owned());
    }
    let url = url::Url::parse(raw).with_context(|| format!("origin {raw:?} is not a URL"))?;
    anyhow::ensure!(
        matches!(url.scheme(), "http" | "https"),
        "origin {raw:?} must be http(s)"
    );
    Ok(url.origin().ascii_serialization())
}

async fn copy_to(
    config: &ServeConfig,
    sqlite: &tally::store::sqlite::SqliteStore,
    url: &str,
) -> anyhow::Result<()> {
    let target = tally::ops::config::Database::from_arg(PathBuf::from(url));
    let tally::ops::config::Database::Postgres(url) = &target else {
        anyhow::bail!("copy-to takes a PostgreSQL URL (postgres://…), not {target}");
    };
    let options = tally::store::postgres::PgOptions {
        pool_size: 2,
        max_new_pages_per_day: config.max_new_pages_per_day,
        schema: None,
    };
    let pg = tally::store::postgres::PgStore::open(url, options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open database {target}: {e}"))?;
    let started = std::time::Instant::now();
    let report = tally::store::copy::sqlite_to_postgres(sqlite, &pg)
        .await
        .map_err(|e| anyhow::anyhow!("nothing was copied: {e}"))?;
    for (table, rows) in &report.tables {
        println!("{table:<15} {rows:>12} rows");
    }
    println!(
        "copied to {target} in {:.1} s; verifying there",
        started.elapsed().as_secs_f64()
    );
    verify(Arc::new(pg), false).await
}

async fn verify(store: Arc<dyn tally::store::Store>, repair: bool) -> anyhow::Result<()> {
    let counted = store.verify(repair).await?;
    let rolled = verify_rollups(&store, None, repair).await?;
    report_verify(joined(counted, rolled))
}

/// Recount the month rollups of `site` (or of every site) from the day segments.
async fn verify_rollups(
    store: &Arc<dyn tally::store::Store>,
    site: Option<&SiteId>,
    repair: bool,
) -> anyhow::Result<tally::store::VerifyReport> {
    let sites: Vec<_> = store
        .list_sites()
        .await?
        .into_iter()
        .filter(|s| site.is_none_or(|id| s.id == *id))
        .collect();
    let analytics = tally::store::analytics::Analytics::new(store.clone(), 0);
    Ok(analytics.verify_rollups(&sites, repair).await?)
}

/// Two verify reports as one.
fn joined(
    mut a: tally::store::VerifyReport,
    b: tally::store::VerifyReport,
) -> tally::store::VerifyReport {
    a.checked += b.checked;
    a.drift.extend(b.drift);
    a.repaired |= b.repaired;
    a
}

/// Print a verify's drift and totals; exit 1 on drift left unrepaired.
fn report_verify(report: tally::store::VerifyReport) -> anyhow::Result<()> {
    for d in &report.drift {
        println!(
            "drift {}: stored views/visitors {:?}, recount {:?}",
            d.key, d.stored, d.recounted
        );
    }
    println!(
        "checked {} counters, {} drifted{}",
        report.checked,
        report.drift.len(),
        if report.repaired { ", repaired" } else { "" }
    );
    if !report.drift.is_empty() && !report.repaired {
        std::process::exit(1);
    }
    Ok(())
}
