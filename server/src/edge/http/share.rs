//! Shared read-only links: `GET /share/{token}` (the site's dashboard, read-only),
//! `POST /share/{token}` (a password-protected link's password form), the share bearer of the
//! stats API, and the admin's "Share" forms (`POST /dashboard/{site}/shares`, `POST
//! /dashboard/{site}/shares/{id}/revoke`).
//!
//! Contract:
//! - A link is looked up in the store by its token's SHA-256 on every request (no cache), so
//!   a revoked link is refused at once by every collector on the database; an expired one is
//!   refused too (HTML page for the dashboard, JSON `share_revoked` / `share_expired` for the
//!   API). A link opens its own site's dashboard and stats API, nothing else: no other site,
//!   no admin page or form, no ingest.
//! - A password-protected link needs its password cookie (see `collect::shares`), set by the
//!   password form; a wrong password is a throttled guess (per client network, as in
//!   `http::auth`). Revoking the link ends its cookie (the cookie names the link, which must be
//!   in the store). Unknown tokens are charged as guesses too.
//! - The admin forms need a signed-in session, its CSRF token (`http::auth`), and a
//!   same-origin request (`Sec-Fetch-Site`, else `Origin` against `Host`): a cross-site post
//!   is refused with 403 `cross_site` before anything changes.

use std::net::SocketAddr;

use askama::Template;
use axum::Router;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{ConnectInfo, Form, Path, Query, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Deserialize;

use super::dashboard::{RangeQuery, View, render, see_other, site_of, with_retry_after};
use super::share_access::{Closed, find};
use super::ui::html;
use super::{ApiError, AppState, SiteSegment};
use crate::collect::shares::{ShareCookieKey, TOKEN_PREFIX, new_share, password_matches};
use crate::core::site::Site;
use crate::store::Share;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/share/{token}", get(page).post(unlock))
        .route("/dashboard/{site}/shares", post(create))
        .route("/dashboard/{site}/shares/{id}/revoke", post(revoke))
}

#[derive(Template)]
#[template(path = "share_closed.html")]
struct ClosedPage {
    expired: bool,
}

#[derive(Template)]
#[template(path = "share_password.html")]
struct PasswordPage {
    site: String,
    action: String,
    failed: bool,
    retry_after: Option<u64>,
}

fn closed_page(closed: Closed) -> Response {
    let (status, expired) = match closed {
        Closed::Revoked => (StatusCode::NOT_FOUND, false),
        Closed::Expired => (StatusCode::GONE, true),
    };
    html(status, ClosedPage { expired }.render())
}

fn password_page(share: &Share, token: &str, failed: bool, retry_after: Option<u64>) -> Response {
    let status = match retry_after {
        Some(_) => StatusCode::TOO_MANY_REQUESTS,
        None => StatusCode::UNAUTHORIZED,
    };
    let mut r = html(
        status,
        PasswordPage {
            site: share.site.to_string(),
            action: format!("/share/{token}"),
            failed,
            retry_after,
        }
        .render(),
    );
    if let Some(wait) = retry_after {
        with_retry_after(&mut r, wait);
    }
    r
}

/// The path segment as a token (anything else is an unknown link, never a lookup).
fn token_of(raw: &str) -> Option<&str> {
    (raw.starts_with(TOKEN_PREFIX) && raw.len() <= 128).then_some(raw)
}

async fn page(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(raw): Path<String>,
    headers: HeaderMap,
    query: Result<Query<RangeQuery>, QueryRejection>,
    RawQuery(raw_query): RawQuery,
) -> Result<Response, ApiError> {
    let Some(token) = token_of(&raw) else {
        return Ok(closed_page(Closed::Revoked));
    };
    let share = match find(&state, token, peer, &headers).await {
        Ok(Ok(share)) => share,
        Ok(Err(closed)) => return Ok(closed_page(closed)),
        Err(ApiError::RateLimited { retry_after }) => {
            let mut r = html(
                StatusCode::TOO_MANY_REQUESTS,
                ClosedPage { expired: false }.render(),
            );
            with_retry_after(&mut r, retry_after);
            return Ok(r);
        }
        Err(e) => return Err(e),
    };
    let now_ms = state.clock.now().as_millisecond();
    if share.password_hash.is_some() && !state.auth.has_share_cookie(&headers, &share, now_ms) {
        return Ok(password_page(&share, token, false, None));
    }
    let q = super::query(query)?;
    let site = site_of(&state, &share.site).await?;
    render(
        &state,
        &site,
        &q,
        raw_query.as_deref(),
        peer,
        &headers,
        View::Shared,
    )
    .await
}

#[derive(Deserialize)]
struct PasswordForm {
    password: String,
}

async fn unlock(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(raw): Path<String>,
    headers: HeaderMap,
    form: Result<Form<PasswordForm>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(|e| ApiError::bad("invalid_form", e.body_text()))?;
    let Some(token) = token_of(&raw) else {
        return Ok(closed_page(Closed::Revoked));
    };
    let share = match find(&state, token, peer, &headers).await {
        Ok(Ok(share)) => share,
        Ok(Err(closed)) => return Ok(closed_page(closed)),
        Err(e) => return Err(e),
    };
    let Some(stored) = share.password_hash.clone() else {
        return Ok(see_other(&format!("/share/{token}")));
    };
    let net = state.client_net(peer, &headers);
    let now = state.clock.now();
    if let Err(t) = state.auth.before_guess(net, now).await {
        return Ok(password_page(&share, token, false, Some(t.retry_after)));
    }
    let given = form.password;
    // argon2 is deliberately slow: off the runtime's workers.
    let right = tokio::task::spawn_blocking(move || password_matches(&stored, &given))
        .await
        .unwrap_or(false);
    if !right {
        state.auth.failed_guess(net, now).await;
        return Ok(password_page(&share, token, true, None));
    }
    let value = state.auth.share_cookie(&share, now.as_millisecond());
    let mut r = see_other(&format!("/share/{token}"));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{}={value}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age={}",
        ShareCookieKey::name(&share),
        state.auth.lifetime_secs()
    )) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// Refuse a cross-site post: `Sec-Fetch-Site` other than `same-origin`, or (from a browser
/// that does not send it) an `Origin` whose host is not the request's `Host`.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let refused = || ApiError::Forbidden {
        code: "cross_site",
        message: "this form may only be sent from the dashboard itself".into(),
    };
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text("sec-fetch-site") {
        return match site {
            "same-origin" | "none" => Ok(()),
            _ => Err(refused()),
        };
    }
    if let Some(origin) = text(header::ORIGIN.as_str()) {
        let host = text(header::HOST.as_str()).unwrap_or_default();
        let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
        if origin_host != host {
            return Err(refused());
        }
    }
    Ok(())
}

/// The admin form's common start: same origin, a session, its CSRF token, the site.
async fn admin_form(
    state: &AppState,
    raw: &str,
    peer: SocketAddr,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<Site, ApiError> {
    same_origin(headers)?;
    let id = super::site_id(raw)?;
    if !state.is_admin(peer, headers).await? {
        return Err(ApiError::Unauthorized);
    }
    let now_ms = state.clock.now().as_millisecond();
    if !state.auth.csrf_matches(headers, csrf, now_ms) {
        return Err(ApiError::Forbidden {
            code: "bad_csrf_token",
            message: "the form's token is not this session's; reload the dashboard".into(),
        });
    }
    Ok((*site_of(state, &id).await?).clone())
}

#[derive(Deserialize)]
struct CreateForm {
    csrf: String,
    /// Days until the link expires; empty: never.
    #[serde(default)]
    expires_days: String,
    /// Empty: no password.
    #[serde(default)]
    password: String,
}

/// Where a link is shown: under `--public-url` when set, else as a path.
pub fn share_url(public_url: Option<&str>, token: &str) -> String {
    format!("{}/share/{token}", public_url.unwrap_or_default())
}

#[derive(Template)]
#[template(path = "share_created.html")]
struct CreatedPage {
    site: String,
    url: String,
    id: String,
}

async fn create(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    SiteSegment(raw): SiteSegment,
    headers: HeaderMap,
    form: Result<Form<CreateForm>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(|e| ApiError::bad("invalid_form", e.body_text()))?;
    let site = admin_form(&state, &raw, peer, &headers, &form.csrf).await?;
    let days = match form.expires_days.trim() {
        "" => None,
        d => Some(d.parse::<u32>().map_err(|_| {
            ApiError::bad("invalid_expiry", "expiry must be a whole number of days")
        })?),
    };
    let password = Some(form.password).filter(|p| !p.is_empty());
    let now_ms = state.clock.now().as_millisecond();
    let site_id = site.id.clone();
    let made =
        tokio::task::spawn_blocking(move || new_share(&site_id, now_ms, days, password.as_deref()))
            .await
            .map_err(|_| ApiError::StorageUnavailable)?
            .map_err(|e| ApiError::bad("invalid_share", e.to_string()))?;
    state.store.create_share(&made.share).await?;
    let url = share_url(state.options.public_url.as_deref(), &made.token);
    Ok(html(
        StatusCode::CREATED,
        CreatedPage {
            site: site.id.to_string(),
            url,
            id: made.share.id,
        }
        .render(),
    ))
}

#[derive(Deserialize)]
struct RevokeForm {
    csrf: String,
}

async fn revoke(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((raw, id)): Path<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<RevokeForm>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(|e| ApiError::bad("invalid_form", e.body_text()))?;
    let site = admin_form(&state, &raw, peer, &headers, &form.csrf).await?;
    let owned = state.store.list_shares(&site.id).await?;
    if !owned.iter().any(|s| s.id == id) {
        return Err(ApiError::NotFound(format!(
            "no shared link {id:?} of site {}",
            site.id
        )));
    }
    state.store.revoke_share(&id).await?;
    Ok(see_other(&format!("/dashboard/{}#share", site.id)))
}
