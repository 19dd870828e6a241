//! Sending mail: the `--smtp` URL, the sender address, and one message out through lettre.
//!
//! Contract:
//! - `smtps://user:pass@host:465` is implicit TLS; `smtp://user:pass@host:587` requires
//!   STARTTLS (a server that does not offer it is an error, never a plain fallback);
//!   `smtp://host:25?tls=none` is plain SMTP and only for a loopback host (a relay on this
//!   machine), refused for any other.
//! - Certificates are checked against Mozilla's roots plus the PEM file of `--smtp-ca`, never
//!   skipped.
//! - The password is a [`Secret`]: [`SmtpUrl`]'s `Display` and `Debug`, and every
//!   [`MailError`], show the URL without it.

use std::net::IpAddr;
use std::time::Duration;

use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::collect::secrets::Secret;

/// How long one connection and each SMTP command may take.
const SMTP_TIMEOUT: Duration = Duration::from_secs(60);

/// A mail problem; its text never holds a password.
#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("smtp URL: {0}")]
    Url(String),
    #[error("mail-from {0:?} is not an email address")]
    From(String),
    #[error("smtp-ca {path}: {problem}")]
    Ca { path: String, problem: String },
    #[error("{0:?} is not an email address")]
    Recipient(String),
    #[error("building the message failed: {0}")]
    Message(String),
    #[error("sending to {relay} failed: {problem}")]
    Send { relay: String, problem: String },
}

/// How the connection to the relay is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// TLS from the first byte (`smtps://`, port 465 by default).
    Implicit,
    /// Plain, then STARTTLS, required (`smtp://`, port 587 by default).
    StartTls,
    /// No TLS at all (`smtp://…?tls=none`, loopback hosts only, port 25 by default).
    Plain,
}

/// A parsed `--smtp` URL.
#[derive(Clone)]
pub struct SmtpUrl {
    pub security: Security,
    pub host: String,
    pub port: u16,
    pub user: Option<String>,
    pub password: Option<Secret>,
}

impl SmtpUrl {
    /// Parse `smtp://` or `smtps://` URLs (see the module contract).
    pub fn parse(raw: &str) -> Result<Self, MailError> {
        // The URL parser's own errors never echo the input; ours name no password.
        let url = url::Url::parse(raw).map_err(|e| {
            MailError::Url(format!(
                "{e} (expected smtps://user:pass@host:465 or smtp://user:pass@host:587)"
            ))
        })?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| MailError::Url("the URL names no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let mut tls_none = false;
        for (key, value) in url.query_pairs() {
            match (key.as_ref(), value.as_ref()) {
                ("tls", "none") => tls_none = true,
                (key, _) => {
                    return Err(MailError::Url(format!(
                        "unknown parameter {key:?} (only tls=none, for a loopback relay)"
                    )));
                }
            }
        }
        let security = match (url.scheme(), tls_none) {
            ("smtps", false) => Security::Implicit,
            ("smtp", false) => Security::StartTls,
            ("smtp", true) if is_loopback(&host) => Security::Plain,
            ("smtp", true) => {
                return Err(MailError::Url(format!(
                    "tls=none sends passwords and reports in clear text: only for a relay on \
                     this machine (localhost, 127.0.0.1, ::1), not {host}"
                )));
            }
            ("smtps", true) => {
                return Err(MailError::Url(
                    "smtps:// is TLS; tls=none contradicts it".into(),
                ));
            }
            (other, _) => {
                return Err(MailError::Url(format!(
                    "scheme {other:?} is not smtp or smtps"
                )));
            }
        };
        let port = url.port().unwrap_or(match security {
            Security::Implicit => 465,
            Security::StartTls => 587,
            Security::Plain => 25,
        });
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| MailError::Url("user or password is not UTF-8".into()))
        };
        let user = match url.username() {
            "" => None,
            u => Some(decode(u)?),
        };
        let password = url.password().map(decode).transpose()?.map(Secret::from);
        if password.is_some() && user.is_none() {
            return Err(MailError::Url("a password without a user".into()));
        }
        Ok(Self {
            security,
            host,
            port,
            user,
            password,
        })
    }
}

/// The URL without its password: `smtp://user:***@host:587`.
impl std::fmt::Display for SmtpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.security {
            Security::Implicit => "smtps",
            Security::StartTls | Security::Plain => "smtp",
        };
        write!(f, "{scheme}://")?;
        if let Some(user) = &self.user {
            write!(f, "{user}")?;
            if self.password.is_some() {
                f.write_str(":***")?;
            }
            f.write_str("@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{}:{}", self.host, self.port)?;
        }
        if self.security == Security::Plain {
            f.write_str("?tls=none")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for SmtpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SmtpUrl({self})")
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Parse an email address (`a@example.com` or `Name <a@example.com>`).
pub fn parse_address(raw: &str) -> Result<Mailbox, MailError> {
    raw.trim()
        .parse::<Mailbox>()
        .map_err(|_| MailError::Recipient(raw.to_owned()))
}

/// What sending mail needs, checked at startup.
#[derive(Clone)]
pub struct MailSettings {
    pub url: SmtpUrl,
    /// The sender of every report.
    pub from: Mailbox,
    /// Extra trusted roots (PEM) for a private relay.
    pub ca_pem: Option<Vec<u8>>,
}

/// The relay without its password, the sender, and whether a CA file is set.
impl std::fmt::Debug for MailSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MailSettings")
            .field("url", &self.url)
            .field("from", &self.from.to_string())
            .field("ca", &self.ca_pem.as_ref().map(|_| "set"))
            .finish()
    }
}

impl MailSettings {
    /// From the `--smtp`, `--mail-from` and `--smtp-ca` values. Without `--mail-from` the
    /// sender is the SMTP user when it is an address, else `tally@<relay host>`.
    pub fn resolve(
        smtp: &Secret,
        from: Option<&str>,
        ca: Option<&std::path::Path>,
    ) -> Result<Self, MailError> {
        let url = SmtpUrl::parse(smtp.expose())?;
        let from = match from {
            Some(raw) => raw
                .parse::<Mailbox>()
                .map_err(|_| MailError::From(raw.to_owned()))?,
            None => {
                let address = match &url.user {
                    Some(user) if user.parse::<lettre::Address>().is_ok() => user.clone(),
                    _ => format!("tally@{}", url.host),
                };
                format!("Tally <{address}>")
                    .parse::<Mailbox>()
                    .map_err(|_| MailError::From(address))?
            }
        };
        let ca_pem = ca
            .map(|path| {
                let pem = std::fs::read(path).map_err(|e| MailError::Ca {
                    path: path.display().to_string(),
                    problem: e.to_string(),
                })?;
                Certificate::from_pem(&pem).map_err(|e| MailError::Ca {
                    path: path.display().to_string(),
                    problem: format!("not a PEM certificate ({e})"),
                })?;
                Ok(pem)
            })
            .transpose()?;
        Ok(Self { url, from, ca_pem })
    }
}

/// An SMTP client for one relay.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The relay without its password, for errors and logs.
    relay: String,
}

impl Mailer {
    /// A client of the relay in `settings` (connects only when sending).
    pub fn new(settings: &MailSettings) -> Result<Self, MailError> {
        let url = &settings.url;
        let tls = |host: &str| {
            let mut params = TlsParameters::builder(host.to_owned());
            if let Some(pem) = &settings.ca_pem {
                let cert = Certificate::from_pem(pem)
                    .map_err(|e| MailError::Url(format!("smtp-ca: {e}")))?;
                params = params.add_root_certificate(cert);
            }
            params
                .build()
                .map_err(|e| MailError::Url(format!("TLS settings: {e}")))
        };
        let mode = match url.security {
            Security::Implicit => Tls::Wrapper(tls(&url.host)?),
            Security::StartTls => Tls::Required(tls(&url.host)?),
            Security::Plain => Tls::None,
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(url.host.clone())
            .port(url.port)
            .tls(mode)
            .timeout(Some(SMTP_TIMEOUT));
        if let Some(user) = &url.user {
            let password = url
                .password
                .as_ref()
                .map(|p| p.expose().to_owned())
                .unwrap_or_default();
            builder = builder.credentials(Credentials::new(user.clone(), password));
        }
        Ok(Self {
            transport: builder.build(),
            from: settings.from.clone(),
            relay: url.to_string(),
        })
    }

    /// The relay, password hidden.
    pub fn relay(&self) -> &str {
        &self.relay
    }

    /// Send one message with a plain-text and an HTML part.
    pub async fn send(
        &self,
        to: &Mailbox,
        subject: &str,
        text: String,
        html: String,
    ) -> Result<(), MailError> {
        let message = Message::builder()
            .from(self.from.clone())
            .to(to.clone())
            .subject(subject)
            .multipart(MultiPart::alternative_plain_html(text, html))
            .map_err(|e| MailError::Message(e.to_string()))?;
        self.transport
            .send(message)
            .await
            .map(|_| ())
            .map_err(|e| MailError::Send {
                relay: self.relay.clone(),
                // lettre's errors name the server's answer, never the credentials.
                problem: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_choose_tls_and_hide_the_password() {
        let u = SmtpUrl::parse("smtps://me%40example.com:hunter2@mail.example.com").expect("ok");
        assert_eq!((u.security, u.port), (Security::Implicit, 465));
        assert_eq!(u.user.as_deref(), Some("me@example.com"));
        let shown = format!("{u} {u:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("mail.example.com:465"),
            "{shown}"
        );
        let u = SmtpUrl::parse("smtp://a:b@mail.example.com").expect("ok");
        assert_eq!((u.security, u.port), (Security::StartTls, 587));
        let u = SmtpUrl::parse("smtp://127.0.0.1:2525?tls=none").expect("ok");
        assert_eq!((u.security, u.port), (Security::Plain, 2525));
        for bad in [
            "smtp://a:hunter2@mail.example.com?tls=none",
            "http://mail.example.com",
            "smtp://",
            "smtps://localhost?tls=none",
            "smtp://localhost?tls=off",
            "not a url hunter2",
        ] {
            let e = SmtpUrl::parse(bad).expect_err(bad).to_string();
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn the_sender_defaults_to_the_smtp_user_or_the_relay() {
        let s = MailSettings::resolve(
            &"smtp://me%40example.com:pw@mail.example.com".into(),
            None,
            None,
        )
        .expect("ok");
        assert_eq!(s.from.email.to_string(), "me@example.com");
        let s = MailSettings::resolve(&"smtp://mail.example.com".into(), None, None).expect("ok");
        assert_eq!(s.from.email.to_string(), "tally@mail.example.com");
        assert!(
            MailSettings::resolve(&"smtp://mail.example.com".into(), Some("nope"), None).is_err()
        );
        assert!(parse_address("not an address").is_err());
        assert!(parse_address("ann@example.com").is_ok());
    }
}
