//! Shared read-only links over real HTTP: a link opens its site's dashboard and stats API and
//! nothing else; expiry, revocation (at once, on a second collector of one PostgreSQL
//! database), the password flow with its throttle and cookie, CSRF refusals of the admin
//! forms, the CLI, and the store contract on both backends.

use std::sync::Arc;

use sha2::Digest;
use tally::collect::shares::new_share;
use tally::core::ids::SiteId;
use tally::ops::config::ServeConfig;
use tally::store::{Share, Store};
use tokio::process::Command;

use crate::sessions::http;
use crate::store_conformance::postgres::Db;
use crate::support::{Binary, Options, UA, spawn_app_with};

const TOKEN: &str = "shares-admin-token-0123";
const SECRET: &str = "a-shared-secret-of-the-two-collectors-012345";

/// `tally --db DB ARGS…` with `stdin`; its status and stdout.
async fn tally(db: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--db")
        .arg(db)
        .args(args)
        .envs(env.iter().copied())
        .env("TALLY_LOG", "warn")
        .env_remove("TALLY_PUBLIC_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("tally");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn add_private(db: &str, id: &str) {
    let origin = format!("https://{id}.example");
    let (ok, _) = tally(db, &["site", "add", id, "--origin", &origin], &[]).await;
    assert!(ok, "site add {id}");
}

/// `tally site share SITE ARGS…`: (id, path of the URL).
async fn share(db: &str, site: &str, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut all = vec!["site", "share", site];
    all.extend_from_slice(args);
    let (ok, out) = tally(db, &all, env).await;
    assert!(ok, "site share: {out}");
    let mut lines = out.lines();
    let id = lines.next().expect("id").to_owned();
    let url = lines.next().expect("url").to_owned();
    (id, url)
}

async fn status(c: &reqwest::Client, url: String, bearer: Option<&str>) -> (u16, String) {
    let mut r = c.get(url);
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    let r = r.send().await.expect("get");
    (r.status().as_u16(), r.text().await.expect("body"))
}

#[tokio::test]
async fn a_link_opens_its_site_read_only_and_nothing_else() {
    let dir = tempfile::tempdir().expect("dir");
    let db_path = dir.path().join("tally.sqlite");
    let db = db_path.to_str().expect("utf-8").to_owned();
    add_private(&db, "secret").await;
    add_private(&db, "other").await;
    let (id, path) = share(&db, "secret", &["--expires", "7"], &[]).await;
    assert!(id.starts_with("sh_") && id.len() == 11, "{id}");
    assert!(
        path.starts_with("/share/tsh_"),
        "a path without --url: {path}"
    );
    let token = path.trim_start_matches("/share/").to_owned();
    let (_, url_out) = tally(
        &db,
        &["site", "share", "secret", "--url", "https://stats.example/"],
        &[],
    )
    .await;
    assert!(
        url_out.contains("https://stats.example/share/tsh_"),
        "{url_out}"
    );

    // The database holds the token's SHA-256, never the token.
    {
        let conn = rusqlite::Connection::open(&db_path).expect("open");
        let rows: Vec<(String, Vec<u8>)> = conn
            .prepare("SELECT id, token_hash FROM shares ORDER BY created_ms")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        let dump: String = conn
            .query_row(
                "SELECT group_concat(id || site || hex(token_hash) || coalesce(password_hash, '')) FROM shares",
                [],
                |r| r.get(0),
            )
            .expect("dump");
        assert!(!dump.contains(&token) && !dump.contains(&token[4..]));
        assert_eq!(rows[0].0, id);
        assert_eq!(rows[0].1, sha2::Sha256::digest(token.as_bytes()).to_vec());
    }
    let (ok, listed) = tally(&db, &["site", "shares", "secret"], &[]).await;
    assert!(
        ok && listed.contains(&id) && listed.contains("no-password"),
        "{listed}"
    );

    let app = Binary::start_in(dir.path(), &["--admin-token", TOKEN]).await;
    let c = http();
    // Without the link the site is private.
    assert_eq!(status(&c, app.url("/dashboard/secret"), None).await.0, 401);
    let (code, page) = status(&c, app.url(&path), None).await;
    assert_eq!(code, 200);
    assert!(
        page.contains("secret") && page.contains("shared-note"),
        "the dashboard"
    );
    assert!(
        !page.contains("Sign out") && !page.contains("id=\"share\""),
        "no admin controls"
    );
    let (code, _) = status(&c, app.url(&format!("{path}?range=7d")), None).await;
    assert_eq!(code, 200, "range links stay on the link");
    for route in ["series", "top", "events", "filtered"] {
        let url = app.url(&format!("/api/v1/sites/secret/{route}?range=7d"));
        assert_eq!(status(&c, url, Some(&token)).await.0, 200, "{route}");
        let url = app.url(&format!("/api/v1/sites/other/{route}"));
        let (code, body) = status(&c, url, Some(&token)).await;
        assert_eq!(code, 403, "{route} of another site");
        assert!(body.contains("share_other_site"), "{body}");
    }
    assert_eq!(
        status(&c, app.url("/dashboard/other"), Some(&token))
            .await
            .0,
        403
    );
    // No admin action with the link.
    let r = c
        .post(app.url("/dashboard/secret/shares"))
        .bearer_auth(&token)
        .form(&[("csrf", "x"), ("expires_days", "")])
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401, "no share management");
    let r = c
        .post(app.url(&format!("/dashboard/secret/shares/{id}/revoke")))
        .bearer_auth(&token)
        .form(&[("csrf", "x")])
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401, "no revoking");

    // Unshare by id: refused at once.
    let (ok, _) = tally(&db, &["site", "unshare", &id], &[]).await;
    assert!(ok);
    let (code, page) = status(&c, app.url(&path), None).await;
    assert_eq!(code, 404);
    assert!(page.contains("share-revoked"));
    let (code, body) = status(&c, app.url("/api/v1/sites/secret/series"), Some(&token)).await;
    assert_eq!(code, 401);
    assert!(body.contains("share_revoked"), "{body}");
    // Site removal revokes the rest.
    let (ok, out) = tally(&db, &["site", "remove", "secret"], &[]).await;
    assert!(ok && out.contains("1 shared link(s) revoked"), "{out}");
    app.stop().await;
}

fn site() -> SiteId {
    SiteId::parse("blog").expect("id")
}

#[tokio::test]
async fn an_expired_link_is_refused() {
    let app = spawn_app_with(Options::default()).await;
    let now = app.now().as_millisecond();
    let made = new_share(&site(), now, Some(1), None).expect("made");
    app.store.create_share(&made.share).await.expect("stored");
    let path = format!("/share/{}", made.token);
    let c = http();
    assert_eq!(status(&c, app.url(&path), None).await.0, 200);
    app.clock.advance_millis(86_400_000);
    let (code, page) = status(&c, app.url(&path), None).await;
    assert_eq!(code, 410);
    assert!(page.contains("share-expired"));
    let (code, body) = status(&c, app.url("/api/v1/sites/blog/series"), Some(&made.token)).await;
    assert_eq!(code, 401);
    assert!(body.contains("share_expired"), "{body}");
}

#[tokio::test]
async fn a_password_link_needs_its_password_and_revoking_ends_its_cookie() {
    let app = spawn_app_with(Options::default()).await;
    let now = app.now().as_millisecond();
    let made = new_share(&site(), now, None, Some("open sesame")).expect("made");
    app.store.create_share(&made.share).await.expect("stored");
    let path = format!("/share/{}", made.token);
    let c = http();
    let (code, page) = status(&c, app.url(&path), None).await;
    assert_eq!(code, 401);
    assert!(
        page.contains("name=\"password\"") && !page.contains("<script"),
        "a plain form"
    );
    let api = app.url("/api/v1/sites/blog/series");
    let (code, body) = status(&c, api.clone(), Some(&made.token)).await;
    assert_eq!(code, 401);
    assert!(body.contains("share_password_required"), "{body}");
    let post = |c: reqwest::Client, pw: &'static str| {
        let url = app.url(&path);
        async move {
            c.post(url)
                .form(&[("password", pw)])
                .send()
                .await
                .expect("post")
        }
    };
    let wrong = post(c.clone(), "wrong").await;
    assert_eq!(wrong.status(), 401);
    assert!(wrong.text().await.expect("body").contains("not right"));
    for _ in 1..tally::edge::http::auth::FAILURES_PER_MINUTE {
        post(c.clone(), "wrong").await;
    }
    let throttled = post(c.clone(), "open sesame").await;
    assert_eq!(
        throttled.status(),
        429,
        "throttled before the password is compared"
    );
    assert!(throttled.headers().contains_key("retry-after"));
    // Another network may still try.
    let other = reqwest::Client::builder()
        .user_agent(UA)
        .redirect(reqwest::redirect::Policy::none())
        .local_address(Some("127.0.0.2".parse().expect("ip")))
        .build()
        .expect("client");
    let right = post(other.clone(), "open sesame").await;
    assert_eq!(right.status(), 303);
    let set = right.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax"),
        "{set}"
    );
    assert!(
        set.starts_with(&format!("tally_share_{}=", made.share.id)),
        "{set}"
    );
    let cookie = set.split(';').next().expect("pair").to_owned();
    let with = |url: String| other.get(url).header("cookie", cookie.clone()).send();
    assert_eq!(with(app.url(&path)).await.expect("get").status(), 200);
    let r = other
        .get(&api)
        .bearer_auth(&made.token)
        .header("cookie", cookie.clone())
        .send()
        .await
        .expect("api");
    assert_eq!(r.status(), 200, "the API with the cookie");
    assert!(
        app.store
            .revoke_share(&made.share.id)
            .await
            .expect("revoke")
    );
    assert_eq!(
        with(app.url(&path)).await.expect("get").status(),
        404,
        "cookie ended"
    );
}

/// Sign in: the `tally_admin=…` pair.
async fn login(c: &reqwest::Client, app: &Binary) -> String {
    let r = c
        .post(app.url("/dashboard/secret/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("login");
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().expect("text");
    set.split(';').next().expect("pair").to_owned()
}

/// The private dashboard as the admin of `cookie` sees it.
async fn admin_page(c: &reqwest::Client, app: &Binary, cookie: &str) -> String {
    c.get(app.url("/dashboard/secret"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("body")
}

fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..].split('"').next().expect("value").to_owned()
}

#[tokio::test]
async fn the_share_section_is_the_admins_and_refuses_cross_site_forms() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    add_private(db.to_str().expect("utf-8"), "secret").await;
    let app = Binary::start_in(dir.path(), &["--admin-token", TOKEN]).await;
    let c = http();
    let cookie = login(&c, &app).await;
    let page = admin_page(&c, &app, &cookie).await;
    assert!(page.contains("id=\"share\"") && page.contains("<h2 id=\"share-title\">Share</h2>"));
    assert!(
        page.contains("<label for=\"expires_days\">"),
        "labelled fields"
    );
    let csrf = csrf_of(&page);
    let create = |headers: Vec<(&'static str, String)>, token: String| {
        let mut r = c
            .post(app.url("/dashboard/secret/shares"))
            .header("cookie", &cookie)
            .form(&[
                ("csrf", token),
                ("expires_days", "3".into()),
                ("password", "".into()),
            ]);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    let cross = create(vec![("sec-fetch-site", "cross-site".into())], csrf.clone())
        .await
        .expect("post");
    assert_eq!(cross.status(), 403);
    assert!(cross.text().await.expect("body").contains("cross_site"));
    let evil = create(
        vec![("origin", "https://evil.example".into())],
        csrf.clone(),
    )
    .await
    .expect("post");
    assert_eq!(evil.status(), 403);
    let no_token = create(
        vec![("sec-fetch-site", "same-origin".into())],
        "forged".into(),
    )
    .await
    .expect("post");
    assert_eq!(no_token.status(), 403);
    assert!(
        no_token
            .text()
            .await
            .expect("body")
            .contains("bad_csrf_token")
    );
    let (ok, listed) = tally(
        db.to_str().expect("utf-8"),
        &["site", "shares", "secret"],
        &[],
    )
    .await;
    assert!(ok && listed.is_empty(), "nothing made: {listed}");

    let made = create(vec![("sec-fetch-site", "same-origin".into())], csrf.clone())
        .await
        .expect("post");
    assert_eq!(made.status(), 201);
    let shown = made.text().await.expect("body");
    let at = shown.find("value=\"/share/").expect("the url shown") + 7;
    let path = shown[at..].split('"').next().expect("url").to_owned();
    assert_eq!(
        status(&c, app.url(&path), None).await.0,
        200,
        "the link works"
    );
    let page = admin_page(&c, &app, &cookie).await;
    let id = page[page.find("shares/sh_").expect("listed") + 7..]
        .split('/')
        .next()
        .expect("id")
        .to_owned();
    let revoke = |site: &'static str, token: String| {
        c.post(app.url(&format!("/dashboard/secret/shares/{id}/revoke")))
            .header("cookie", &cookie)
            .header("sec-fetch-site", site)
            .form(&[("csrf", token)])
            .send()
    };
    assert_eq!(
        revoke("cross-site", csrf.clone())
            .await
            .expect("post")
            .status(),
        403
    );
    assert_eq!(status(&c, app.url(&path), None).await.0, 200, "still works");
    assert_eq!(
        revoke("same-origin", csrf).await.expect("post").status(),
        303
    );
    assert_eq!(status(&c, app.url(&path), None).await.0, 404, "revoked");
    app.stop().await;
}

#[tokio::test]
async fn unshare_on_one_collector_is_refused_at_once_by_the_other() {
    let Some(db) = Db::new() else { return };
    let url = db.url_in_schema();
    add_private(&url, "secret").await;
    let (id, path) = share(
        &url,
        "secret",
        &["--password"],
        &[("TALLY_SHARE_PASSWORD", "pw-123")],
    )
    .await;
    let token = path.trim_start_matches("/share/").to_owned();
    let args = ["--admin-token", TOKEN, "--secret", SECRET];
    let a = Binary::start_on(tempfile::tempdir().expect("dir"), url.clone().into(), &args).await;
    let b = Binary::start_on(tempfile::tempdir().expect("dir"), url.clone().into(), &args).await;
    let c = http();
    let r = c
        .post(a.url(&path))
        .form(&[("password", "pw-123")])
        .send()
        .await
        .expect("unlock");
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .split(';')
        .next()
        .expect("pair")
        .to_owned();
    let get = |app: &Binary| {
        c.get(app.url(&path))
            .header("cookie", cookie.clone())
            .send()
    };
    assert_eq!(
        get(&b).await.expect("b").status(),
        200,
        "the cookie works on every collector"
    );
    let api = |app: &Binary| {
        c.get(app.url("/api/v1/sites/secret/top"))
            .bearer_auth(&token)
            .header("cookie", cookie.clone())
            .send()
    };
    assert_eq!(api(&b).await.expect("api").status(), 200);
    let (ok, _) = tally(&url, &["site", "unshare", &id], &[]).await;
    assert!(ok);
    // No wait: the very next request to either collector is refused.
    assert_eq!(get(&b).await.expect("b").status(), 404);
    assert_eq!(get(&a).await.expect("a").status(), 404);
    assert_eq!(api(&b).await.expect("api").status(), 401);
    a.stop().await;
    b.stop().await;
}

/// The [`tally::store::ShareStore`] contract on one backend.
async fn share_store_contract(store: Arc<dyn Store>) {
    let blog = site();
    let other = SiteId::parse("other").expect("id");
    let mut a = new_share(&blog, 1_000, None, None).expect("a").share;
    a.created_ms = 1_000;
    let b = Share {
        created_ms: 2_000,
        ..new_share(&blog, 2_000, Some(1), Some("pw"))
            .expect("b")
            .share
    };
    let c = new_share(&other, 500, None, None).expect("c").share;
    for s in [&b, &a, &c] {
        store.create_share(s).await.expect("create");
    }
    assert!(store.create_share(&a).await.is_err(), "an id is taken once");
    assert_eq!(
        store.list_shares(&blog).await.expect("list"),
        vec![a.clone(), b.clone()]
    );
    assert_eq!(
        store
            .share_by_token_hash(&b.token_hash)
            .await
            .expect("find"),
        Some(b.clone())
    );
    assert_eq!(
        store.share_by_token_hash(&[0; 32]).await.expect("find"),
        None
    );
    assert!(store.revoke_share(&a.id).await.expect("revoke"));
    assert!(!store.revoke_share(&a.id).await.expect("again"));
    assert_eq!(
        store
            .share_by_token_hash(&a.token_hash)
            .await
            .expect("find"),
        None
    );
    assert_eq!(store.revoke_site_shares(&blog).await.expect("site"), 1);
    assert!(store.list_shares(&blog).await.expect("list").is_empty());
    assert_eq!(store.list_shares(&other).await.expect("list"), vec![c]);
}

#[tokio::test]
async fn the_share_store_contract_holds_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    let config = ServeConfig::for_db(dir.path().join("t.sqlite"));
    share_store_contract(tally::open_store(&config).await.expect("open")).await;
}

#[tokio::test]
async fn the_share_store_contract_holds_on_postgres() {
    let Some(db) = Db::new() else { return };
    share_store_contract(Arc::new(db.pg_store(0).await)).await;
}
