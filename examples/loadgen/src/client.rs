//! The HTTP/1.1 client of every mode: one keep-alive connection per [`Conn`], optionally bound
//! to a chosen loopback source address (so the server can tell visitors and an attacker apart
//! by address), every request and connect bounded by a timeout, and every failure sorted into
//! the classes the reports count (refused, closed, timed out).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::SendRequest;
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;

/// Longest wait for a TCP connect (a full accept backlog drops SYNs silently).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One open connection; dropping it closes the socket.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// Drives the connection; aborted on drop so a timed-out request cannot keep it open.
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a connection could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectError {
    /// The server refused (RST): nothing listens, or the backlog overflowed.
    Refused,
    /// No answer within [`CONNECT_TIMEOUT`].
    Timeout,
    /// Anything else (address not available, handshake failure).
    Other,
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No full answer within the request's timeout.
    Timeout,
    /// The connection closed or reset before the answer was complete.
    Closed,
}

/// A complete answer.
pub struct Answer {
    pub status: u16,
    /// `X-Tally-Status` (badge and pixel say there whether the view counted).
    pub tally_status: Option<String>,
    pub body: Bytes,
}

/// Open a socket to `addr`, from `source` when given (any 127.0.0.0/8 address works on Linux
/// loopback without configuration).
pub async fn open_socket(
    addr: SocketAddr,
    source: Option<IpAddr>,
) -> Result<tokio::net::TcpStream, ConnectError> {
    let socket = TcpSocket::new_v4().map_err(|_| ConnectError::Other)?;
    if let Some(ip) = source {
        socket
            .bind(SocketAddr::new(ip, 0))
            .map_err(|_| ConnectError::Other)?;
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr)).await {
        Err(_) => Err(ConnectError::Timeout),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => Err(ConnectError::Refused),
        Ok(Err(_)) => Err(ConnectError::Other),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Open a keep-alive HTTP/1.1 connection.
pub async fn connect(addr: SocketAddr, source: Option<IpAddr>) -> Result<Conn, ConnectError> {
    let stream = open_socket(addr, source).await?;
    stream.set_nodelay(true).map_err(|_| ConnectError::Other)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|_| ConnectError::Other)?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Conn { sender, task })
}

impl Conn {
    /// Send one request and read the whole answer within `timeout`. After a failure the
    /// connection is unusable: drop it.
    pub async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let exchange = async {
            self.sender.ready().await.map_err(|_| Failure::Closed)?;
            let res = self
                .sender
                .send_request(req)
                .await
                .map_err(|_| Failure::Closed)?;
            let status = res.status().as_u16();
            let tally_status = res
                .headers()
                .get("x-tally-status")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|_| Failure::Closed)?
                .to_bytes();
            Ok(Answer {
                status,
                tally_status,
                body,
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or(Err(Failure::Timeout))
    }
}

/// `GET path` with the given headers.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    build(hyper::Method::GET, path, headers, Bytes::new())
}

/// `POST path` with the given headers and body.
pub fn post(path: &str, headers: &[(&str, &str)], body: Bytes) -> Request<Full<Bytes>> {
    build(hyper::Method::POST, path, headers, body)
}

fn build(
    method: hyper::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = method;
    // A path we cannot parse is our own bug; fall back to "/" rather than panic.
    *req.uri_mut() = path
        .parse()
        .unwrap_or_else(|_| hyper::Uri::from_static("/"));
    let map = req.headers_mut();
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            map.append(n, v);
        }
    }
    req
}
