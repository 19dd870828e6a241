//! Secrets of a running collector: the admin and metrics tokens, and the server secret.
//!
//! Contract:
//! - A [`Secret`] never prints: its `Debug` and `Display` are `<redacted>`, so no config dump,
//!   error or log line can hold one. Comparisons go through [`Secret::matches`], which hashes
//!   both sides first (constant time, no length leak).
//! - Tokens a person types ([`check_token`]) are at least 16 printable ASCII characters without
//!   spaces, so every accepted token can be typed into the login form and sent as `Bearer`.
//!   The refusal names the rule, never the value.
//! - The [`ServerSecret`] is 32 bytes derived from `TALLY_SECRET` (or `secret` in the file), or
//!   from a secret file, by default `tally.secret` next to the database, created with mode 0600
//!   and 32 random bytes (hex) on first start. It is mixed into every visitor hash and into the
//!   session key, and it is never written to the database: a copy of the database alone cannot
//!   link a stored hash to an address or forge a session.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Shortest accepted token, in characters.
pub const MIN_TOKEN_CHARS: usize = 16;
/// Shortest accepted server secret, in characters (e.g. `openssl rand -hex 32` gives 64).
pub const MIN_SECRET_CHARS: usize = 32;

/// A string that never prints.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` equals this secret, in time independent of both values and lengths
    /// (both are hashed to 32 bytes, whose comparison is constant-time).
    pub fn matches(&self, given: &str) -> bool {
        constant_time_eq(given, &self.0)
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Why a token was refused (never holds the token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("is {0} characters long; it must be at least {MIN_TOKEN_CHARS}")]
    TooShort(usize),
    #[error(
        "holds a character that is not printable ASCII (letters, digits, punctuation; no spaces)"
    )]
    NotPrintableAscii,
}

/// Check a token a person types: ≥ 16 printable ASCII characters, no spaces.
pub fn check_token(token: &Secret) -> Result<(), TokenError> {
    let t = token.expose();
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenError::NotPrintableAscii);
    }
    if t.len() < MIN_TOKEN_CHARS {
        return Err(TokenError::TooShort(t.len()));
    }
    Ok(())
}

/// Where the server secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Given directly (`TALLY_SECRET`, `secret` in the config file).
    Value(Secret),
    /// Read from this file, created on first start.
    File(PathBuf),
}

impl SecretSource {
    /// The default: `tally.secret` in the database's directory.
    pub fn beside(db: &Path) -> Self {
        SecretSource::File(db.with_file_name("tally.secret"))
    }
}

/// Why the server secret could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the server secret must be at least {MIN_SECRET_CHARS} characters")]
    TooShort,
    #[error("cannot read the secret file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the secret file {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the secret file {0} is shorter than {MIN_SECRET_CHARS} characters; delete it to have a new one made"
    )]
    ShortFile(PathBuf),
}

/// The 32-byte server secret (see the module doc).
#[derive(Clone, PartialEq, Eq)]
pub struct ServerSecret([u8; 32]);

impl fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerSecret(<redacted>)")
    }
}

impl ServerSecret {
    fn derive(material: &str) -> Self {
        Self(blake3::derive_key(
            "tally 2026-12 server secret v1",
            material.trim().as_bytes(),
        ))
    }

    /// A secret from bytes (tests and embedding).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The key material, for deriving per-purpose keys.
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A key for one purpose (`context` names it), derived from this secret and `extra`.
    pub fn derive_key(&self, context: &str, extra: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key(context);
        h.update(&self.0);
        h.update(&(extra.len() as u64).to_le_bytes());
        h.update(extra);
        *h.finalize().as_bytes()
    }

    /// Load the secret from its source; a missing secret file is created (mode 0600).
    pub fn load(source: &SecretSource) -> Result<Self, SecretError> {
        match source {
            SecretSource::Value(v) => {
                if v.expose().trim().chars().count() < MIN_SECRET_CHARS {
                    return Err(SecretError::TooShort);
                }
                Ok(Self::derive(v.expose()))
            }
            SecretSource::File(path) => Self::load_file(path),
        }
    }

    fn load_file(path: &Path) -> Result<Self, SecretError> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                if text.trim().chars().count() < MIN_SECRET_CHARS {
                    return Err(SecretError::ShortFile(path.to_owned()));
                }
                warn_if_readable_by_others(path);
                Ok(Self::derive(&text))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let fresh: String = random_bytes::<32>()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                match create_private(path, &fresh) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "created a new server secret");
                        Ok(Self::derive(&fresh))
                    }
                    // Another process created it first: use theirs.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        Self::load_file(path)
                    }
                    Err(source) => Err(SecretError::Create {
                        path: path.to_owned(),
                        source,
                    }),
                }
            }
            Err(source) => Err(SecretError::Read {
                path: path.to_owned(),
                source,
            }),
        }
    }
}

/// Write `text` to a new file readable by its owner only, durably, and all at once: it is
/// written to a private temporary file beside `path` first, then linked into place without
/// replacing anything (`AlreadyExists` if another process got there first). So a second
/// collector starting at the same moment reads either no file or the whole secret, never an
/// empty one.
fn create_private(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // tempfile creates it with mode 0600 on unix.
    let mut file = tempfile::Builder::new()
        .prefix(".tally.secret.")
        .tempfile_in(dir)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")?;
    file.as_file().sync_all()?;
    file.persist_noclobber(path).map_err(|e| e.error)?;
    // The new name is durable once its directory is.
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            "the secret file is readable by other users; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_: &Path) {}

/// `N` random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    // getrandom only fails where the OS has no entropy source at all; fall back to time noise
    // rather than panic on a request path.
    if getrandom::fill(&mut buf).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let h = blake3::hash(&t.to_le_bytes());
        for (b, s) in buf.iter_mut().zip(h.as_bytes().iter().cycle()) {
            *b = *s;
        }
    }
    buf
}

/// Whether two secrets are equal, in time that depends on neither their content nor their
/// lengths: both are hashed to 32 bytes first, and the digests compared without branching.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (blake3::hash(a.as_bytes()), blake3::hash(b.as_bytes()));
    // blake3's `Hash` equality is constant-time.
    a == b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::from("hunter2-hunter2-hunter2");
        assert_eq!(format!("{s:?} {s}"), "<redacted> <redacted>");
        let server = ServerSecret::from_bytes([7; 32]);
        assert!(!format!("{server:?}").contains('7'));
    }

    #[test]
    fn tokens_are_long_printable_ascii() {
        assert!(check_token(&"abcdefghijklmnop".into()).is_ok());
        assert_eq!(check_token(&"short".into()), Err(TokenError::TooShort(5)));
        assert_eq!(
            check_token(&"päßwörd-päßwörd-päßwörd".into()),
            Err(TokenError::NotPrintableAscii)
        );
        assert_eq!(
            check_token(&"with spaces inside it".into()),
            Err(TokenError::NotPrintableAscii)
        );
        let e = check_token(&"tiny-token".into()).expect_err("short");
        assert!(!e.to_string().contains("tiny"));
    }

    #[test]
    fn matching_is_exact() {
        let s = Secret::from("abcdefghijklmnop");
        assert!(s.matches("abcdefghijklmnop"));
        assert!(!s.matches("abcdefghijklmno"));
        assert!(!s.matches("abcdefghijklmnopq"));
        assert!(!s.matches(""));
    }

    #[test]
    fn collectors_starting_at_once_share_one_whole_secret() {
        for _ in 0..20 {
            let dir = tempfile::tempdir().expect("dir");
            let source = SecretSource::File(dir.path().join("tally.secret"));
            let start = std::sync::Barrier::new(8);
            let got: Vec<_> = std::thread::scope(|s| {
                let starters: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            ServerSecret::load(&source)
                        })
                    })
                    .collect();
                starters
                    .into_iter()
                    .map(|t| {
                        t.join()
                            .expect("thread")
                            .expect("every start loads the secret")
                    })
                    .collect()
            });
            assert!(got.iter().all(|s| *s == got[0]), "one secret for all");
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .expect("list")
                .map(|e| e.expect("entry").file_name())
                .collect();
            assert_eq!(names, ["tally.secret"], "no temporary file is left behind");
        }
    }

    #[test]
    fn the_secret_file_is_created_private_once_and_reused() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("tally.sqlite");
        let source = SecretSource::beside(&db);
        let first = ServerSecret::load(&source).expect("created");
        let path = dir.path().join("tally.secret");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(ServerSecret::load(&source).expect("read"), first);
        std::fs::write(&path, "short\n").expect("write");
        assert!(matches!(
            ServerSecret::load(&source),
            Err(SecretError::ShortFile(_))
        ));
        let value = SecretSource::Value("x".repeat(40).into());
        assert!(ServerSecret::load(&value).is_ok());
        assert!(matches!(
            ServerSecret::load(&SecretSource::Value("x".into())),
            Err(SecretError::TooShort)
        ));
    }
}
