//! Who a share token lets in: the link looked up by its token's SHA-256 on every request (no
//! cache, so a revocation holds at once on every collector), the stats API's share bearer, and
//! the admin's list of a site's links. Used by the dashboard and by `http::share` (the pages
//! and forms), so it imports neither.

use std::net::SocketAddr;

use axum::http::HeaderMap;

use super::{ApiError, AppState};
use crate::collect::shares::token_hash;
use crate::core::ids::SiteId;
use crate::core::site::Site;
use crate::store::Share;

/// Why a link does not open.
pub(super) enum Closed {
    /// Unknown or revoked (the store cannot tell them apart: a revoked link is deleted).
    Revoked,
    Expired,
}

/// The live link of `token`, looked up in the store now. An unknown token is a guess.
pub(super) async fn find(
    state: &AppState,
    token: &str,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<Result<Share, Closed>, ApiError> {
    let net = state.client_net(peer, headers);
    let now = state.clock.now();
    state
        .auth
        .before_guess(net, now)
        .await
        .map_err(|t| ApiError::RateLimited {
            retry_after: t.retry_after,
        })?;
    match state.store.share_by_token_hash(&token_hash(token)).await? {
        None => {
            state.auth.failed_guess(net, now).await;
            Ok(Err(Closed::Revoked))
        }
        Some(share) if !share.is_live(now.as_millisecond()) => Ok(Err(Closed::Expired)),
        Some(share) => Ok(Ok(share)),
    }
}

/// Whether a share bearer `token` may read `site`'s stats API: `Ok` or the JSON refusal.
pub(super) async fn api_access(
    state: &AppState,
    token: &str,
    site: &SiteId,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let share = match find(state, token, peer, headers).await? {
        Ok(share) => share,
        Err(Closed::Revoked) => {
            return Err(ApiError::ShareRefused {
                code: "share_revoked",
                message: "this shared link does not exist or was revoked".into(),
            });
        }
        Err(Closed::Expired) => {
            return Err(ApiError::ShareRefused {
                code: "share_expired",
                message: "this shared link has expired".into(),
            });
        }
    };
    if share.site != *site {
        return Err(ApiError::Forbidden {
            code: "share_other_site",
            message: "this shared link is for another site".into(),
        });
    }
    let now_ms = state.clock.now().as_millisecond();
    if share.password_hash.is_some() && !state.auth.has_share_cookie(headers, &share, now_ms) {
        return Err(ApiError::ShareRefused {
            code: "share_password_required",
            message: "this shared link has a password: send the cookie its password form sets"
                .into(),
        });
    }
    Ok(())
}

/// One link in the admin's list.
pub struct ShareRowView {
    pub id: String,
    pub created: String,
    pub expires: String,
    pub password: bool,
}

/// The dashboard's "Share" section (a signed-in admin only).
pub struct AdminShares {
    /// The CSRF token of the forms.
    pub csrf: String,
    pub links: Vec<ShareRowView>,
}

pub(super) fn when(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|_| ms.to_string())
}

/// The "Share" section of `site` for the admin of `headers`; `None` without a session (a
/// bearer-token admin gets no forms).
pub(super) async fn admin_shares(
    state: &AppState,
    site: &Site,
    headers: &HeaderMap,
) -> Result<Option<AdminShares>, ApiError> {
    let now_ms = state.clock.now().as_millisecond();
    let Some(csrf) = state.auth.csrf_token(headers, now_ms) else {
        return Ok(None);
    };
    let links = state
        .store
        .list_shares(&site.id)
        .await?
        .into_iter()
        .map(|s| ShareRowView {
            expires: match s.expires_ms {
                None => "never".into(),
                Some(at) if at <= now_ms => format!("{} (expired)", when(at)),
                Some(at) => when(at),
            },
            created: when(s.created_ms),
            password: s.password_hash.is_some(),
            id: s.id,
        })
        .collect();
    Ok(Some(AdminShares { csrf, links }))
}
