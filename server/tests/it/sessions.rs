//! The admin door of several collectors (real `tally serve` processes): a logout is kept in
//! the database, so it holds after a restart and on every collector of the database; with
//! `--redis`, wrong token guesses are counted once for all collectors.
//! Needs `TALLY_TEST_POSTGRES` and `TALLY_TEST_REDIS` (`.ci/run` sets both).

use std::time::{Duration, Instant};

use tally::edge::http::auth::SESSION_REFRESH;
use tokio::process::Command;

use crate::store_conformance::postgres::Db;
use crate::support::{Binary, UA, redis_cleanup, redis_url};

const TOKEN: &str = "sessions-admin-token-0123";
const SECRET: &str = "a-shared-secret-of-the-two-collectors-012345";

/// A client that does not follow redirects (the forms answer 303).
pub(crate) fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(UA)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// `tally site add secret` (a private site: its dashboard needs the admin).
async fn add_private_site(db: &str) {
    let status = Command::new(env!("CARGO_BIN_EXE_tally"))
        .args([
            "--db",
            db,
            "site",
            "add",
            "secret",
            "--origin",
            "https://secret.example",
        ])
        .env("TALLY_LOG", "warn")
        .status()
        .await
        .expect("site add");
    assert!(status.success());
}

/// Sign in on `at`: the `tally_admin=…` cookie pair.
async fn login(at: &Binary) -> String {
    let r = http()
        .post(at.url("/dashboard/secret/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("login");
    assert_eq!(r.status(), 303, "signed in");
    let set = r.headers()["set-cookie"].to_str().expect("text");
    set.split(';').next().expect("pair").to_owned()
}

async fn logout(at: &Binary, cookie: &str) {
    let r = http()
        .post(at.url("/dashboard/secret/logout"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("logout");
    assert_eq!(r.status(), 303, "signed out");
}

/// The status of the private dashboard with `cookie`: 200 signed in, 401 not.
async fn dashboard(at: &Binary, cookie: &str) -> u16 {
    http()
        .get(at.url("/dashboard/secret"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("dashboard")
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_logout_holds_after_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    add_private_site(db.to_str().expect("utf-8")).await;
    let args = ["--admin-token", TOKEN];
    let first = Binary::start_in(dir.path(), &args).await;
    let before = login(&first).await;
    assert_eq!(dashboard(&first, &before).await, 200);
    logout(&first, &before).await;
    let after = login(&first).await;
    assert_eq!(dashboard(&first, &before).await, 401);
    first.stop().await;

    // Same database, same secret file beside it: the session made after the logout still
    // works (so the key is the same), the one before it does not.
    let second = Binary::start_in(dir.path(), &args).await;
    assert_eq!(
        dashboard(&second, &after).await,
        200,
        "a live session survives"
    );
    assert_eq!(
        dashboard(&second, &before).await,
        401,
        "the logout survives"
    );
    second.stop().await;
}

#[tokio::test]
async fn a_logout_on_one_collector_ends_the_session_on_the_others() {
    let Some(db) = Db::new() else { return };
    let url = db.url_in_schema();
    add_private_site(&url).await;
    let args = ["--admin-token", TOKEN, "--secret", SECRET];
    let a = Binary::start_on(tempfile::tempdir().expect("dir"), url.clone().into(), &args).await;
    let b = Binary::start_on(tempfile::tempdir().expect("dir"), url.into(), &args).await;

    let cookie = login(&a).await;
    assert_eq!(
        dashboard(&b, &cookie).await,
        200,
        "one session for every collector"
    );
    logout(&a, &cookie).await;
    let ended = Instant::now();
    assert_eq!(
        dashboard(&a, &cookie).await,
        401,
        "at once where the logout was taken"
    );
    // The other collector reads the logout from the database every SESSION_REFRESH.
    let bound = SESSION_REFRESH + Duration::from_secs(3);
    loop {
        if dashboard(&b, &cookie).await == 401 {
            break;
        }
        assert!(
            ended.elapsed() < bound,
            "the other collector still took the session {:?} after the logout",
            ended.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new session works on both.
    let fresh = login(&b).await;
    assert_eq!(dashboard(&a, &fresh).await, 200);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn wrong_guesses_are_counted_once_for_every_collector_on_one_redis() {
    let Some(redis) = redis_url() else { return };
    let prefix = format!("tally-test:{}:", uuid::Uuid::new_v4().simple());
    let args = [
        "--admin-token",
        TOKEN,
        "--secret",
        SECRET,
        "--redis",
        &redis,
        "--redis-prefix",
        &prefix,
    ];
    // Two collectors, each on its own database: only Redis is shared.
    let mut collectors = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("tally.sqlite");
        add_private_site(db.to_str().expect("utf-8")).await;
        collectors.push(Binary::start_on(dir, db, &args).await);
    }
    let guess = |at: &Binary, token: &str| {
        let request = http()
            .post(at.url("/dashboard/secret/login"))
            .form(&[("token", token)]);
        async move { request.send().await.expect("login").status().as_u16() }
    };
    for i in 0..tally::edge::http::auth::FAILURES_PER_MINUTE {
        let at = &collectors[i as usize % 2];
        assert_eq!(guess(at, "wrong-guess-0123456789").await, 401, "guess {i}");
    }
    // Five wrong guesses on each: the network is out of guesses on both, even with the token.
    for at in &collectors {
        assert_eq!(guess(at, TOKEN).await, 429);
    }
    for c in collectors {
        c.stop().await;
    }
    assert!(
        redis_cleanup(&redis, &prefix) > 0,
        "the guesses were counted in Redis"
    );
}
