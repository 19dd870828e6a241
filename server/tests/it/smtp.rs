//! A small, real SMTP server for the report tests: plain SMTP with STARTTLS on one port and
//! implicit TLS on another, both with a self-signed certificate (rcgen) whose PEM file the
//! collector is told to trust (`--smtp-ca`). It speaks EHLO/HELO, AUTH PLAIN and LOGIN,
//! MAIL, RCPT, DATA (dot-unstuffed), RSET, NOOP, QUIT and STARTTLS, records every message it
//! accepts, and can refuse the next N messages with a 451 after their data.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// One accepted message.
#[derive(Debug, Clone)]
pub struct Received {
    pub from: String,
    pub to: Vec<String>,
    /// The message as sent (headers and body), dot-unstuffed, CRLF line ends.
    pub data: String,
    /// Whether the session was encrypted (STARTTLS or implicit TLS).
    pub tls: bool,
    /// The user of a successful AUTH, if any.
    pub user: Option<String>,
}

#[derive(Default)]
struct Shared {
    messages: Mutex<Vec<Received>>,
    refuse: AtomicU32,
}

/// The running server; its tasks end with the test's runtime.
pub struct SmtpServer {
    /// Plain SMTP, STARTTLS offered.
    pub port: u16,
    /// Implicit TLS.
    pub tls_port: u16,
    /// The certificate to trust (PEM).
    pub ca: std::path::PathBuf,
    shared: Arc<Shared>,
    _dir: tempfile::TempDir,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl SmtpServer {
    pub async fn start() -> Self {
        let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(names).expect("certificate");
        let dir = tempfile::tempdir().expect("dir");
        let ca = dir.path().join("smtp-ca.pem");
        std::fs::write(&ca, cert.pem()).expect("write ca");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into()),
            )
            .expect("tls config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let shared = Arc::new(Shared::default());
        let plain = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let implicit = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (port, tls_port) = (
            plain.local_addr().expect("addr").port(),
            implicit.local_addr().expect("addr").port(),
        );
        for (listener, wrapped) in [(plain, false), (implicit, true)] {
            let (shared, acceptor) = (Arc::clone(&shared), acceptor.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let (shared, acceptor) = (Arc::clone(&shared), acceptor.clone());
                    tokio::spawn(async move {
                        if wrapped {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = session(Box::new(tls), true, None, false, &shared).await;
                            }
                        } else {
                            let _ =
                                session(Box::new(stream), false, Some(acceptor), false, &shared)
                                    .await;
                        }
                    });
                }
            });
        }
        Self {
            port,
            tls_port,
            ca,
            shared,
            _dir: dir,
        }
    }

    /// Answer the next `n` messages with `451` after their data (nothing recorded).
    pub fn refuse_next(&self, n: u32) {
        self.shared.refuse.store(n, Ordering::SeqCst);
    }

    /// The messages accepted so far.
    pub fn messages(&self) -> Vec<Received> {
        self.shared.messages.lock().expect("lock").clone()
    }

    /// Plain SMTP to this server (loopback: allowed without TLS).
    pub fn plain_url(&self) -> String {
        format!("smtp://127.0.0.1:{}?tls=none", self.port)
    }
}

/// Serve one SMTP session; a STARTTLS upgrades the stream and starts a new session on it.
fn session<'a>(
    stream: Box<dyn Io + 'a>,
    tls: bool,
    starttls: Option<TlsAcceptor>,
    upgraded: bool,
    shared: &'a Shared,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send + 'a>> {
    Box::pin(async move {
        let mut io = BufReader::new(stream);
        // After STARTTLS the client speaks first (EHLO again): no second greeting.
        if !upgraded {
            io.write_all(b"220 test.smtp ESMTP ready\r\n").await?;
            io.flush().await?;
        }
        let (mut from, mut to, mut user) = (None::<String>, Vec::new(), None::<String>);
        let mut line = String::new();
        loop {
            line.clear();
            if io.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let command = line.trim_end().to_owned();
            let verb = command
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            let reply: String = match verb.as_str() {
                "EHLO" => {
                    let mut r = String::from("250-test.smtp\r\n250-8BITMIME\r\n");
                    if starttls.is_some() && !tls {
                        r.push_str("250-STARTTLS\r\n");
                    }
                    r.push_str("250 AUTH PLAIN LOGIN\r\n");
                    r
                }
                "HELO" => "250 test.smtp\r\n".into(),
                "STARTTLS" if starttls.is_some() && !tls => {
                    io.write_all(b"220 go ahead\r\n").await?;
                    io.flush().await?;
                    let acceptor = starttls.clone().expect("checked");
                    let tls_stream = acceptor.accept(io.into_inner()).await?;
                    return session(Box::new(tls_stream), true, None, true, shared).await;
                }
                "AUTH" => {
                    let mut parts = command.split_whitespace().skip(1);
                    let mechanism = parts.next().unwrap_or("").to_ascii_uppercase();
                    let decode = |s: &str| {
                        use base64::Engine;
                        base64::engine::general_purpose::STANDARD.decode(s).ok()
                    };
                    match mechanism.as_str() {
                        "PLAIN" => {
                            let initial = match parts.next() {
                                Some(i) => i.to_owned(),
                                None => {
                                    io.write_all(b"334 \r\n").await?;
                                    io.flush().await?;
                                    line.clear();
                                    io.read_line(&mut line).await?;
                                    line.trim_end().to_owned()
                                }
                            };
                            let raw = decode(&initial).unwrap_or_default();
                            let fields: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
                            user = fields
                                .get(1)
                                .map(|u| String::from_utf8_lossy(u).into_owned());
                            "235 ok\r\n".into()
                        }
                        "LOGIN" => {
                            io.write_all(b"334 VXNlcm5hbWU6\r\n").await?;
                            io.flush().await?;
                            line.clear();
                            io.read_line(&mut line).await?;
                            let name = decode(line.trim_end()).unwrap_or_default();
                            io.write_all(b"334 UGFzc3dvcmQ6\r\n").await?;
                            io.flush().await?;
                            line.clear();
                            io.read_line(&mut line).await?;
                            user = Some(String::from_utf8_lossy(&name).into_owned());
                            "235 ok\r\n".into()
                        }
                        _ => "504 unknown mechanism\r\n".into(),
                    }
                }
                "MAIL" => {
                    from = Some(address(&command));
                    to.clear();
                    "250 ok\r\n".into()
                }
                "RCPT" if from.is_some() => {
                    to.push(address(&command));
                    "250 ok\r\n".into()
                }
                "RCPT" => "503 MAIL first\r\n".into(),
                "DATA" if from.is_some() && !to.is_empty() => {
                    io.write_all(b"354 end with .\r\n").await?;
                    io.flush().await?;
                    let mut data = String::new();
                    loop {
                        line.clear();
                        if io.read_line(&mut line).await? == 0 {
                            return Ok(());
                        }
                        if line == ".\r\n" || line == ".\n" {
                            break;
                        }
                        // Dot-unstuffing: a leading ".." was a leading ".".
                        data.push_str(line.strip_prefix('.').unwrap_or(&line));
                    }
                    let refused = shared
                        .refuse
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                    let message = Received {
                        from: from.take().unwrap_or_default(),
                        to: std::mem::take(&mut to),
                        data,
                        tls,
                        user: user.clone(),
                    };
                    if refused {
                        "451 try again later\r\n".into()
                    } else {
                        shared.messages.lock().expect("lock").push(message);
                        "250 queued\r\n".into()
                    }
                }
                "DATA" => "503 MAIL and RCPT first\r\n".into(),
                "RSET" => {
                    from = None;
                    to.clear();
                    "250 ok\r\n".into()
                }
                "NOOP" => "250 ok\r\n".into(),
                "QUIT" => {
                    io.write_all(b"221 bye\r\n").await?;
                    io.flush().await?;
                    return Ok(());
                }
                _ => "502 not implemented\r\n".into(),
            };
            io.write_all(reply.as_bytes()).await?;
            io.flush().await?;
        }
    })
}

/// `MAIL FROM:<a@b> SIZE=1` → `a@b`.
fn address(command: &str) -> String {
    let start = command.find('<').map_or(0, |i| i + 1);
    let end = command[start..]
        .find('>')
        .map_or(command.len(), |i| start + i);
    command[start..end].to_owned()
}
