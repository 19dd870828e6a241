//! Credentials at the edge: the admin token (bearer or signed session cookie), the metrics
//! token, and the throttle on guessing any token.
//!
//! Contract:
//! - Tokens are compared by [`Secret::matches`] (hashes of both sides, constant time, no
//!   length leak).
//! - The session cookie (`tally_admin`) holds a [`SessionKey`] value: signed with a key derived
//!   from the admin token and the server secret, timestamped, valid for `--session-hours`
//!   (default 12) and never after a logout made with a valid session: a logout ends every
//!   session issued before it, on every collector of the database, and a restart keeps it
//!   (the instant is stored: [`crate::store::SaltStore::end_sessions`]). The collector that
//!   takes the logout ends them at once; the others learn it within [`SESSION_REFRESH`].
//! - Failed guesses are throttled per client network (IPv4 /32, IPv6 /64), whatever token was
//!   guessed (admin token by form or bearer, metrics token, a site's ingest key): 10 failures a
//!   minute, then one every 6 s. A throttled network is refused before its guess is compared
//!   (429 with `Retry-After`). Successes and anonymous requests cost nothing, and an expired or
//!   forged cookie is not a guess (a 256-bit MAC cannot be guessed).
//! - Shared links: a link's password cookie is signed by [`ShareCookieKey`] (server secret),
//!   names its link and lasts `--session-hours`; a wrong password is a throttled guess like
//!   any other. Admin forms carry a CSRF token ([`Auth::csrf_token`]): a MAC of the admin's
//!   session value, so it is worthless without the session and ends with it.
//! - The throttle is the collector's [`RateLimiter`] (`may_guess`, `wrong_guess`): in process
//!   (bounded, keyed by a process-random hash: no address is kept), or shared by every
//!   collector on one Redis (`--redis`), so N collectors still allow one network 10 a minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use axum::http::{HeaderMap, header};
use jiff::Timestamp;

use crate::collect::secrets::{Secret, ServerSecret};
use crate::collect::shares::ShareCookieKey;
use crate::core::net::ClientNet;
use crate::core::session::SessionKey;
use crate::state::RateLimiter;
use crate::store::Share;

/// The session cookie's name.
pub const COOKIE: &str = "tally_admin";

/// Failed token guesses one network may make per minute (also the burst).
pub const FAILURES_PER_MINUTE: u32 = crate::state::limits::GUESSES_PER_MINUTE;

/// How often a collector reads the last logout from the store (a logout taken by another
/// collector ends this one's sessions within this bound).
pub const SESSION_REFRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// A network that must wait before its next guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// Seconds until the next guess is taken.
    pub retry_after: u64,
}

/// The credentials of one collector.
pub struct Auth {
    token: Option<Secret>,
    metrics_token: Option<Secret>,
    session: Option<SessionKey>,
    lifetime_ms: i64,
    /// Sessions issued at or before this instant (ms) are over (the last logout).
    not_before_ms: AtomicI64,
    /// Counts wrong guesses per network (shared through Redis with `--redis`).
    limits: Arc<dyn RateLimiter>,
    /// Signs the cookie a shared link's right password gives.
    share_key: ShareCookieKey,
}

/// The credentials of `tally serve`.
#[derive(Clone, Default)]
pub struct AuthOptions {
    /// The admin token (dashboards, stats of private sites).
    pub admin_token: Option<Secret>,
    /// The bearer token `/metrics` requires, if any.
    pub metrics_token: Option<Secret>,
    /// How long a dashboard sign-in lasts.
    pub session_lifetime: std::time::Duration,
}

impl Auth {
    /// Credentials as configured; the session key is derived from the token and `secret`;
    /// wrong guesses are counted by `limits`.
    pub fn new(config: &AuthOptions, secret: &ServerSecret, limits: Arc<dyn RateLimiter>) -> Self {
        let session = config.admin_token.as_ref().map(|t| {
            SessionKey::new(
                secret.derive_key("tally 2026-12 admin session v1", t.expose().as_bytes()),
            )
        });
        Self {
            token: config.admin_token.clone(),
            metrics_token: config.metrics_token.clone(),
            session,
            lifetime_ms: i64::try_from(config.session_lifetime.as_millis()).unwrap_or(i64::MAX),
            not_before_ms: AtomicI64::new(i64::MIN),
            limits,
            share_key: ShareCookieKey::new(secret),
        }
    }

    /// How long a session lasts, in seconds (the cookie's `Max-Age`).
    pub fn lifetime_secs(&self) -> i64 {
        self.lifetime_ms / 1000
    }

    /// Whether an admin token is configured at all.
    pub fn has_admin(&self) -> bool {
        self.token.is_some()
    }

    /// Refuse a network that has used up its failed guesses, before its guess is compared.
    pub async fn before_guess(&self, net: ClientNet, now: Timestamp) -> Result<(), Throttled> {
        self.limits
            .may_guess(net, now)
            .await
            .map_err(|refusal| Throttled {
                retry_after: refusal.guess_retry_after(),
            })
    }

    /// Charge one failed guess to `net`.
    pub async fn failed_guess(&self, net: ClientNet, now: Timestamp) {
        self.limits.wrong_guess(net, now).await;
    }

    /// Compare a guess at `secret`, throttled: `Ok(true)` when it matches.
    async fn guess(
        &self,
        secret: &Secret,
        given: &str,
        net: ClientNet,
        now: Timestamp,
    ) -> Result<bool, Throttled> {
        self.before_guess(net, now).await?;
        if secret.matches(given) {
            return Ok(true);
        }
        self.failed_guess(net, now).await;
        Ok(false)
    }

    /// The valid session's issue time, if the request carries one.
    fn session_of(&self, headers: &HeaderMap, now_ms: i64) -> Option<i64> {
        self.session_value(headers, now_ms)
            .map(|(issued, _)| issued)
    }

    /// The valid session's issue time and value, if the request carries one.
    fn session_value<'a>(&self, headers: &'a HeaderMap, now_ms: i64) -> Option<(i64, &'a str)> {
        let key = self.session.as_ref()?;
        let not_before = self.not_before_ms.load(Ordering::Relaxed);
        cookies(headers, COOKIE).find_map(|value| {
            key.verify(value, now_ms, self.lifetime_ms, not_before)
                .ok()
                .map(|issued| (issued, value))
        })
    }

    /// The CSRF token of the admin's forms: a MAC of the request's valid session value
    /// (`None` without one: only a signed-in admin gets forms).
    pub fn csrf_token(&self, headers: &HeaderMap, now_ms: i64) -> Option<String> {
        let key = self.session.as_ref()?;
        let (_, value) = self.session_value(headers, now_ms)?;
        Some(key.tag("csrf", value).to_hex().to_string())
    }

    /// Whether `given` is the CSRF token of the request's valid session (constant time).
    pub fn csrf_matches(&self, headers: &HeaderMap, given: &str, now_ms: i64) -> bool {
        self.csrf_token(headers, now_ms)
            .is_some_and(|token| crate::collect::secrets::constant_time_eq(&token, given))
    }

    /// A password cookie value for `share`, issued now.
    pub fn share_cookie(&self, share: &Share, now_ms: i64) -> String {
        self.share_key.issue(share, now_ms)
    }

    /// Whether the request carries a valid password cookie of `share`.
    pub fn has_share_cookie(&self, headers: &HeaderMap, share: &Share, now_ms: i64) -> bool {
        let name = ShareCookieKey::name(share);
        cookies(headers, &name).any(|value| {
            self.share_key
                .verify(share, value, now_ms, self.lifetime_ms)
        })
    }

    /// Whether the request is the admin's: a valid session cookie, or `Authorization: Bearer`
    /// with the admin token (a wrong one is a throttled guess).
    pub async fn is_admin(
        &self,
        headers: &HeaderMap,
        net: ClientNet,
        now: Timestamp,
    ) -> Result<bool, Throttled> {
        let Some(token) = &self.token else {
            return Ok(false);
        };
        if self.session_of(headers, now.as_millisecond()).is_some() {
            return Ok(true);
        }
        match bearer(headers) {
            Some(given) => self.guess(token, given, net, now).await,
            None => Ok(false),
        }
    }

    /// A sign-in with the token typed into the form: a new session value when it is right.
    pub async fn login(
        &self,
        given: &str,
        net: ClientNet,
        now: Timestamp,
    ) -> Result<Option<String>, Throttled> {
        let (Some(token), Some(key)) = (&self.token, &self.session) else {
            return Ok(None);
        };
        let ok = self.guess(token, given.trim(), net, now).await?;
        Ok(ok.then(|| {
            // Issued strictly after the last logout, even within the same millisecond.
            let not_before = self.not_before_ms.load(Ordering::Relaxed);
            key.issue(now.as_millisecond().max(not_before.saturating_add(1)))
        }))
    }

    /// End every session of this collector issued until now, if the request holds a valid
    /// one (so a stranger cannot sign the admin out). Returns whether it did; the caller then
    /// stores the instant for the other collectors and restarts ([`Auth::learn_logout`]).
    pub fn logout(&self, headers: &HeaderMap, now_ms: i64) -> bool {
        if self.session_of(headers, now_ms).is_none() {
            return false;
        }
        self.learn_logout(now_ms);
        true
    }

    /// A logout at `at_ms` taken elsewhere (another collector, or before a restart): sessions
    /// issued at or before it are over. The instant never moves back.
    pub fn learn_logout(&self, at_ms: i64) {
        self.not_before_ms.fetch_max(at_ms, Ordering::Relaxed);
    }

    /// Whether `/metrics` may be read: no metrics token configured, or its bearer given.
    pub async fn may_read_metrics(
        &self,
        headers: &HeaderMap,
        net: ClientNet,
        now: Timestamp,
    ) -> Result<bool, Throttled> {
        let Some(token) = &self.metrics_token else {
            return Ok(true);
        };
        match bearer(headers) {
            Some(given) => self.guess(token, given, net, now).await,
            None => Ok(false),
        }
    }
}

/// The `Authorization: Bearer` value.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Every value of the cookie `name` on every `Cookie` line.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(move |c| {
            c.trim()
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('='))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::config::ServeConfig;
    use axum::http::HeaderValue;

    const TOKEN: &str = "a-long-admin-token-0123";
    const T0: i64 = 1_780_000_000_000;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).expect("time")
    }

    fn limits(config: &ServeConfig) -> Arc<dyn RateLimiter> {
        Arc::new(crate::state::memory::Limits::new(config.limits()))
    }

    fn auth() -> Auth {
        let mut config = ServeConfig::for_db("/tmp/unused.sqlite");
        config.admin_token = Some(TOKEN.into());
        config.metrics_token = Some("metrics-token-0123456".into());
        Auth::new(
            &config.auth_options(),
            &ServerSecret::from_bytes([1; 32]),
            limits(&config),
        )
    }

    fn net(last: u8) -> ClientNet {
        ClientNet::V4([192, 0, 2, last])
    }

    fn with_cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={value}; c=d")).expect("value"),
        );
        h
    }

    fn with_bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).expect("value"),
        );
        h
    }

    #[tokio::test]
    async fn a_login_gives_a_session_that_expires_and_ends_at_logout() {
        let a = auth();
        let cookie = a
            .login(TOKEN, net(1), at(T0))
            .await
            .expect("not throttled")
            .expect("right");
        assert!(!cookie.contains(TOKEN));
        let h = with_cookie(&cookie);
        assert_eq!(a.is_admin(&h, net(1), at(T0 + 1000)).await, Ok(true));
        // Another network may use the cookie (it is the credential).
        assert_eq!(a.is_admin(&h, net(2), at(T0 + 1000)).await, Ok(true));
        let twelve_hours = 12 * 3_600_000;
        assert_eq!(
            a.is_admin(&h, net(1), at(T0 + twelve_hours)).await,
            Ok(false)
        );
        // Logout needs a valid session, and ends it (and every older one).
        assert!(!a.logout(&HeaderMap::new(), T0 + 2000));
        assert!(a.logout(&h, T0 + 2000));
        assert_eq!(a.is_admin(&h, net(1), at(T0 + 3000)).await, Ok(false));
        // A session made after the logout works, even in the same millisecond.
        let again = a
            .login(TOKEN, net(1), at(T0 + 2000))
            .await
            .expect("ok")
            .expect("right");
        assert_eq!(
            a.is_admin(&with_cookie(&again), net(1), at(T0 + 2000))
                .await,
            Ok(true)
        );
    }

    #[tokio::test]
    async fn the_session_depends_on_the_token_and_the_server_secret() {
        let a = auth();
        let cookie = a
            .login(TOKEN, net(1), at(T0))
            .await
            .expect("ok")
            .expect("right");
        let mut config = ServeConfig::for_db("/tmp/unused.sqlite");
        config.admin_token = Some(TOKEN.into());
        let other_secret = Auth::new(
            &config.auth_options(),
            &ServerSecret::from_bytes([2; 32]),
            limits(&config),
        );
        assert_eq!(
            other_secret
                .is_admin(&with_cookie(&cookie), net(1), at(T0))
                .await,
            Ok(false)
        );
        config.admin_token = Some("another-admin-token-456".into());
        let other_token = Auth::new(
            &config.auth_options(),
            &ServerSecret::from_bytes([1; 32]),
            limits(&config),
        );
        assert_eq!(
            other_token
                .is_admin(&with_cookie(&cookie), net(1), at(T0))
                .await,
            Ok(false)
        );
    }

    #[tokio::test]
    async fn wrong_guesses_are_throttled_per_network() {
        let a = auth();
        for i in 0..FAILURES_PER_MINUTE {
            assert_eq!(
                a.login("wrong-guess-0000000", net(1), at(T0)).await,
                Ok(None),
                "guess {i}"
            );
        }
        // Throttled now, even with the right token: it is not compared.
        let throttled = a.login(TOKEN, net(1), at(T0)).await.expect_err("throttled");
        assert!((1..=6).contains(&throttled.retry_after), "{throttled:?}");
        assert!(
            a.is_admin(&with_bearer("wrong"), net(1), at(T0))
                .await
                .is_err()
        );
        assert!(
            a.may_read_metrics(&with_bearer("x"), net(1), at(T0))
                .await
                .is_err()
        );
        // Other networks are not affected; the network recovers with time.
        assert!(matches!(a.login(TOKEN, net(2), at(T0)).await, Ok(Some(_))));
        assert!(matches!(
            a.login(TOKEN, net(1), at(T0 + 6_000)).await,
            Ok(Some(_))
        ));
    }

    #[tokio::test]
    async fn bearer_tokens_and_metrics() {
        let a = auth();
        assert_eq!(
            a.is_admin(&with_bearer(TOKEN), net(1), at(T0)).await,
            Ok(true)
        );
        assert_eq!(
            a.is_admin(&with_bearer("nope"), net(1), at(T0)).await,
            Ok(false)
        );
        assert_eq!(
            a.is_admin(&HeaderMap::new(), net(1), at(T0)).await,
            Ok(false)
        );
        let us = at(T0);
        assert_eq!(
            a.may_read_metrics(&HeaderMap::new(), net(1), us).await,
            Ok(false)
        );
        assert_eq!(
            a.may_read_metrics(&with_bearer("metrics-token-0123456"), net(1), us)
                .await,
            Ok(true)
        );
        // The admin token is not the metrics token.
        assert_eq!(
            a.may_read_metrics(&with_bearer(TOKEN), net(1), us).await,
            Ok(false)
        );
    }
}
