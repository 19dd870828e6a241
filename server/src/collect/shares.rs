//! Shared read-only links: their secrets, password hashes and the cookie a right password
//! gives.
//!
//! Contract:
//! - A link's token is `tsh_` + 64 hex digits (32 random bytes); only its SHA-256
//!   ([`token_hash`]) is stored, so a copy of the database opens no link. Its id is `sh_` + 8
//!   hex digits: a public name, printed and listed, that revokes the link and opens nothing.
//! - A password is stored as an argon2id PHC string (random salt); [`password_matches`] is the
//!   only comparison.
//! - The password cookie ([`ShareCookieKey`]) is `<link id>.<issued ms>.<MAC>`, the MAC keyed
//!   by a key derived from the server secret and bound to the link's id and token hash: it
//!   opens that one link only, and only while the link is in the store (the caller looks the
//!   link up on every request, so revoking it ends the cookie too), for at most the lifetime.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use sha2::Digest;

use super::secrets::{ServerSecret, random_bytes};
use crate::core::ids::SiteId;
use crate::store::Share;

/// How every share token starts (so a bearer token is known to be one without a lookup).
pub const TOKEN_PREFIX: &str = "tsh_";

/// Longest password accepted (argon2 costs the same for any length; this bounds the form).
pub const MAX_PASSWORD_BYTES: usize = 1024;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a token: what the store keeps and looks links up by.
pub fn token_hash(token: &str) -> [u8; 32] {
    sha2::Sha256::digest(token.trim().as_bytes()).into()
}

/// A link just made: what to store, and the token to show once.
pub struct NewShare {
    pub share: Share,
    pub token: String,
}

/// Why a link could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    #[error("the password is empty")]
    EmptyPassword,
    #[error("the password is longer than {MAX_PASSWORD_BYTES} bytes")]
    LongPassword,
    #[error("expiry must be 1 to 3650 days")]
    BadExpiry,
    #[error("cannot hash the password: {0}")]
    Hash(String),
}

/// A new link to `site`, made at `now_ms`, working for `expires_days` days (`None`: until
/// revoked), behind `password` if given.
pub fn new_share(
    site: &SiteId,
    now_ms: i64,
    expires_days: Option<u32>,
    password: Option<&str>,
) -> Result<NewShare, ShareError> {
    let expires_ms = match expires_days {
        None => None,
        Some(d @ 1..=3650) => Some(now_ms.saturating_add(i64::from(d) * 86_400_000)),
        Some(_) => return Err(ShareError::BadExpiry),
    };
    let password_hash = password.map(hash_password).transpose()?;
    let token = format!("{TOKEN_PREFIX}{}", hex(&random_bytes::<32>()));
    Ok(NewShare {
        share: Share {
            id: format!("sh_{}", hex(&random_bytes::<4>())),
            site: site.clone(),
            token_hash: token_hash(&token),
            password_hash,
            created_ms: now_ms,
            expires_ms,
        },
        token,
    })
}

/// The argon2id PHC string of `password`.
pub fn hash_password(password: &str) -> Result<String, ShareError> {
    if password.is_empty() {
        return Err(ShareError::EmptyPassword);
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(ShareError::LongPassword);
    }
    let salt = SaltString::encode_b64(&random_bytes::<16>())
        .map_err(|e| ShareError::Hash(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| ShareError::Hash(e.to_string()))
}

/// Whether `given` is the password of the PHC string `stored` (a malformed one matches nothing).
pub fn password_matches(stored: &str, given: &str) -> bool {
    if given.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    PasswordHash::new(stored).is_ok_and(|hash| {
        argon2::Argon2::default()
            .verify_password(given.as_bytes(), &hash)
            .is_ok()
    })
}

/// The MAC key of password cookies.
pub struct ShareCookieKey([u8; 32]);

impl ShareCookieKey {
    /// The key of this server (derived from its secret).
    pub fn new(secret: &ServerSecret) -> Self {
        Self(secret.derive_key("tally 2026-12 share cookie v1", &[]))
    }

    fn mac(&self, share: &Share, issued_ms: i64) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"share v1.");
        h.update(share.id.as_bytes());
        h.update(b".");
        h.update(issued_ms.to_string().as_bytes());
        h.update(b".");
        h.update(&share.token_hash);
        h.finalize()
    }

    /// The name of `share`'s cookie (one per link, so several links can be open at once).
    pub fn name(share: &Share) -> String {
        format!("tally_share_{}", share.id)
    }

    /// A cookie value for `share` issued at `now_ms`.
    pub fn issue(&self, share: &Share, now_ms: i64) -> String {
        format!("{}.{now_ms}.{}", share.id, self.mac(share, now_ms).to_hex())
    }

    /// Whether `value` is a cookie of `share` younger than `lifetime_ms` at `now_ms`.
    pub fn verify(&self, share: &Share, value: &str, now_ms: i64, lifetime_ms: i64) -> bool {
        let mut parts = value.trim().rsplitn(3, '.');
        let (Some(mac), Some(issued), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let Ok(issued_ms) = issued.parse::<i64>() else {
            return false;
        };
        let Ok(given) = blake3::Hash::from_hex(mac) else {
            return false;
        };
        // `blake3::Hash` equality is constant-time.
        id == share.id
            && given == self.mac(share, issued_ms)
            && issued_ms <= now_ms.saturating_add(crate::core::session::SKEW_MS)
            && now_ms.saturating_sub(issued_ms) < lifetime_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_780_000_000_000;

    fn site() -> SiteId {
        SiteId::parse("blog").expect("site")
    }

    #[test]
    fn a_new_link_stores_only_the_hash_of_its_token() {
        let made = new_share(&site(), T0, Some(7), None).expect("made");
        assert!(made.token.starts_with(TOKEN_PREFIX) && made.token.len() == 68);
        assert!(made.share.id.starts_with("sh_") && made.share.id.len() == 11);
        assert_eq!(made.share.token_hash, token_hash(&made.token));
        assert_eq!(made.share.expires_ms, Some(T0 + 7 * 86_400_000));
        assert!(made.share.is_live(T0 + 7 * 86_400_000 - 1));
        assert!(!made.share.is_live(T0 + 7 * 86_400_000));
        let other = new_share(&site(), T0, None, None).expect("made");
        assert_ne!(other.token, made.token);
        assert_eq!(
            new_share(&site(), T0, Some(0), None).err(),
            Some(ShareError::BadExpiry)
        );
    }

    #[test]
    fn passwords_are_argon2_phc_strings() {
        let made = new_share(&site(), T0, None, Some("open sesame")).expect("made");
        let stored = made.share.password_hash.expect("hash");
        assert!(stored.starts_with("$argon2id$"), "{stored}");
        assert!(!stored.contains("open sesame"));
        assert!(password_matches(&stored, "open sesame"));
        assert!(!password_matches(&stored, "open sesame!"));
        assert!(!password_matches("not a phc string", "open sesame"));
        assert_eq!(hash_password("").err(), Some(ShareError::EmptyPassword));
    }

    #[test]
    fn a_cookie_opens_its_own_link_only_and_expires() {
        let key = ShareCookieKey::new(&ServerSecret::from_bytes([3; 32]));
        let a = new_share(&site(), T0, None, Some("pw")).expect("a").share;
        let b = new_share(&site(), T0, None, Some("pw")).expect("b").share;
        let value = key.issue(&a, T0);
        assert!(key.verify(&a, &value, T0 + 1, 3_600_000));
        assert!(!key.verify(&a, &value, T0 + 3_600_000, 3_600_000));
        assert!(!key.verify(&b, &value, T0 + 1, 3_600_000));
        let forged = value.replacen(&a.id, &b.id, 1);
        assert!(!key.verify(&b, &forged, T0 + 1, 3_600_000));
        let other_secret = ShareCookieKey::new(&ServerSecret::from_bytes([4; 32]));
        assert!(!other_secret.verify(&a, &value, T0 + 1, 3_600_000));
        assert!(!key.verify(&a, "garbage", T0, 3_600_000));
    }
}
