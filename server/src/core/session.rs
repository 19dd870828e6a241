//! The admin session cookie: signed, timestamped, expiring.
//!
//! Contract:
//! - A session value is `v1.<issued, ms since the epoch>.<MAC>`, the MAC being 64 hex digits
//!   of `blake3(key = session key, "v1." + issued)`. The key is derived from the admin token
//!   AND the server secret (`secrets::ServerSecret`), so the value holds neither, changes when
//!   either changes, and cannot be made from a copy of the database.
//! - [`SessionKey::verify`] accepts a value only if its MAC is right (compared in constant time),
//!   it was issued no later than `now` + 5 minutes (clock skew between collectors), it is younger
//!   than the lifetime, and it was issued after the last logout (`not_before`).
//! - Parsing is total: any string yields `Ok` or an error, never a panic.
//! - Time is a parameter; nothing here reads a clock.

/// Clock skew tolerated for a session issued "in the future" (another collector's clock).
pub const SKEW_MS: i64 = 5 * 60 * 1000;

/// The MAC key of admin sessions.
#[derive(Clone)]
pub struct SessionKey([u8; 32]);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(<redacted>)")
    }
}

/// Why a session value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("not a session value")]
    Malformed,
    #[error("wrong signature")]
    BadMac,
    #[error("expired")]
    Expired,
    #[error("issued in the future")]
    Future,
    #[error("ended by a logout")]
    LoggedOut,
}

impl SessionKey {
    /// A key from 32 bytes of key material (derived from the token and the server secret).
    pub fn new(key: [u8; 32]) -> Self {
        Self(key)
    }

    fn mac(&self, issued_ms: i64) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"v1.");
        h.update(issued_ms.to_string().as_bytes());
        h.finalize()
    }

    /// A MAC of `value` under this key for the purpose `what` (e.g. a session's CSRF token).
    pub fn tag(&self, what: &str, value: &str) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(b"tag v1.");
        h.update(what.as_bytes());
        h.update(b".");
        h.update(value.as_bytes());
        h.finalize()
    }

    /// A session value issued at `now_ms`.
    pub fn issue(&self, now_ms: i64) -> String {
        format!("v1.{now_ms}.{}", self.mac(now_ms).to_hex())
    }

    /// The issue time of a valid value (see the module doc for what "valid" means).
    pub fn verify(
        &self,
        value: &str,
        now_ms: i64,
        lifetime_ms: i64,
        not_before_ms: i64,
    ) -> Result<i64, SessionError> {
        let mut parts = value.trim().splitn(3, '.');
        let (Some("v1"), Some(issued), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SessionError::Malformed);
        };
        // Canonical decimal only, so one issue time has one spelling.
        if issued.is_empty()
            || issued.len() > 16
            || !issued.bytes().all(|b| b.is_ascii_digit())
            || (issued.len() > 1 && issued.starts_with('0'))
        {
            return Err(SessionError::Malformed);
        }
        let issued_ms: i64 = issued.parse().map_err(|_| SessionError::Malformed)?;
        let given = blake3::Hash::from_hex(mac).map_err(|_| SessionError::Malformed)?;
        // `blake3::Hash` equality is constant-time.
        if given != self.mac(issued_ms) {
            return Err(SessionError::BadMac);
        }
        if issued_ms > now_ms.saturating_add(SKEW_MS) {
            return Err(SessionError::Future);
        }
        if now_ms.saturating_sub(issued_ms) >= lifetime_ms {
            return Err(SessionError::Expired);
        }
        if issued_ms <= not_before_ms {
            return Err(SessionError::LoggedOut);
        }
        Ok(issued_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: i64 = 3_600_000;
    const T0: i64 = 1_780_000_000_000;

    fn key() -> SessionKey {
        SessionKey::new([9; 32])
    }

    #[test]
    fn a_fresh_session_verifies_until_it_expires() {
        let v = key().issue(T0);
        assert_eq!(key().verify(&v, T0, 12 * HOUR, 0), Ok(T0));
        assert_eq!(key().verify(&v, T0 + 12 * HOUR - 1, 12 * HOUR, 0), Ok(T0));
        assert_eq!(
            key().verify(&v, T0 + 12 * HOUR, 12 * HOUR, 0),
            Err(SessionError::Expired)
        );
        assert_eq!(
            key().verify(&v, T0 - SKEW_MS - 1, 12 * HOUR, 0),
            Err(SessionError::Future)
        );
        assert_eq!(
            key().verify(&v, T0 + 1, 12 * HOUR, T0),
            Err(SessionError::LoggedOut)
        );
    }

    #[test]
    fn another_key_or_an_edited_time_fails() {
        let v = key().issue(T0);
        assert_eq!(
            SessionKey::new([8; 32]).verify(&v, T0, HOUR, 0),
            Err(SessionError::BadMac)
        );
        let later = v.replacen(&T0.to_string(), &(T0 + HOUR).to_string(), 1);
        assert_eq!(
            key().verify(&later, T0 + HOUR, 2 * HOUR, 0),
            Err(SessionError::BadMac)
        );
        for bad in [
            "",
            "v1",
            "v1..",
            "v2.1.00",
            "v1.01.x",
            "v1.-5.aa",
            "tally_admin=1",
        ] {
            assert_eq!(
                key().verify(bad, T0, HOUR, 0),
                Err(SessionError::Malformed),
                "{bad}"
            );
        }
    }

    proptest! {
        #[test]
        fn verification_never_panics(value in ".{0,120}", now in any::<i64>(), life in any::<i64>()) {
            let _ = key().verify(&value, now, life, 0);
        }

        #[test]
        fn any_edit_of_a_valid_value_is_refused(at in 0usize..84, c in "[0-9a-f.v]") {
            let v = key().issue(T0);
            let mut edited: Vec<char> = v.chars().collect();
            let i = at % edited.len();
            let new = c.chars().next().expect("a char");
            prop_assume!(edited[i] != new);
            edited[i] = new;
            let edited: String = edited.into_iter().collect();
            prop_assert!(key().verify(&edited, T0, HOUR, 0).is_err());
        }

        #[test]
        fn issued_values_roundtrip(at in 0i64..4_000_000_000_000) {
            prop_assert_eq!(key().verify(&key().issue(at), at, HOUR, -1), Ok(at));
        }
    }
}
