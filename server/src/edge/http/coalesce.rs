//! One read for identical stats requests that wait together: the dashboard, the v1 series,
//! top, events and filtered reads, and the analytics query API.
//!
//! Contract:
//! - **Identical** means the same method, path and query, body, and the request headers an
//!   answer can depend on ([`KEY_HEADERS`]: host, origin, credentials, accepted type);
//!   compared whole, never by a hash, so one user's answer never reaches a request that
//!   differs in any of them. Compression is applied per request outside this layer. The
//!   peer's address decides only admission (its network's share of the stats slots, the
//!   throttle on guessed credentials), which a follower does not need: it takes no slot.
//! - **Never stale.** A request joins only a group whose read has not begun: its leader is
//!   still waiting for a stats slot. The leader closes the group when it takes its slot
//!   ([`started`], called by `AppState::stats_slot`), so every member's answer is read after
//!   the member arrived and holds every hit acknowledged before it. A request arriving later
//!   starts a group of its own.
//! - **Free for the followers.** A follower takes no stats slot and no share of its network:
//!   a crowd on one popular view costs one read, and answers as soon as it does.
//! - The leader's whole answer (status, headers, body) is given to each follower, once its
//!   read began. If the leader was refused before its read (`503 busy` for its network's
//!   share or a full queue, a bad credential) or its request went away (its client
//!   disconnected), each follower runs its own request: one client's refusal is never
//!   another's.
//! - Bounded: a group lives while its leader's request does; a POST body is read only when
//!   its declared length is at most [`MAX_BODY`] (the query API's own limit); anything else
//!   passes through alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

/// The request headers that are part of a request's identity.
pub const KEY_HEADERS: [header::HeaderName; 6] = [
    header::HOST,
    header::ORIGIN,
    header::AUTHORIZATION,
    header::COOKIE,
    header::ACCEPT,
    header::CONTENT_TYPE,
];

/// The largest POST body coalesced: the query API's own limit (it refuses larger ones).
const MAX_BODY: usize = super::query_api::MAX_BODY;

/// An answer as given to each member of a group.
struct Shared {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// What a group's members wait on: `None` until the leader answers.
type Answer = Option<Arc<Shared>>;

/// The groups whose leaders have not begun to read.
pub struct Coalescer {
    open: Mutex<HashMap<Vec<u8>, Arc<Group>>>,
    /// Requests answered by another's read (`tally_stats_coalesced_total`).
    followed: prometheus_client::metrics::counter::Counter,
}

struct Group {
    answer: watch::Sender<Answer>,
    /// The leader took its stats slot: its answer is a read, to be shared.
    began: std::sync::atomic::AtomicBool,
}

/// The leader's hold on its group: closes it when its read begins or the request ends.
#[derive(Clone)]
struct Lead {
    coalescer: Arc<Coalescer>,
    key: Arc<Vec<u8>>,
    group: Arc<Group>,
}

impl Lead {
    fn begin(&self) {
        self.group
            .began
            .store(true, std::sync::atomic::Ordering::Release);
        self.close();
    }

    fn close(&self) {
        let mut open = self.coalescer.lock();
        if open
            .get(self.key.as_slice())
            .is_some_and(|g| Arc::ptr_eq(g, &self.group))
        {
            open.remove(self.key.as_slice());
        }
    }
}

/// Closes the leader's group when the leader's request ends, answered or not (a dropped
/// request leaves no group behind for others to join and wait on forever).
struct CloseOnDrop(Lead);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

tokio::task_local! {
    static LEADING: Lead;
}

/// The read of the current request begins (it holds its stats slot): later identical
/// requests no longer join it. Outside a coalesced request, nothing happens.
pub fn started() {
    let _ = LEADING.try_with(Lead::begin);
}

impl Coalescer {
    pub fn new(followed: prometheus_client::metrics::counter::Counter) -> Self {
        Self {
            open: Mutex::default(),
            followed,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Arc<Group>>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether a request is a stats read this layer coalesces.
fn coalesced(method: &Method, path: &str) -> bool {
    // Every request passes here (hits too): string tests only, nothing allocated.
    let one_segment = |s: &str| !s.is_empty() && !s.contains('/');
    match *method {
        Method::POST => path == "/api/v2/query",
        Method::GET => {
            if let Some(site) = path.strip_prefix("/dashboard/") {
                return one_segment(site);
            }
            path.strip_prefix("/api/v1/sites/")
                .and_then(|rest| rest.split_once('/'))
                .is_some_and(|(site, read)| {
                    !site.contains('/') && matches!(read, "series" | "top" | "events" | "filtered")
                })
        }
        _ => false,
    }
}

fn key_of(req: &axum::http::request::Parts, body: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(256 + body.len());
    key.extend_from_slice(req.method.as_str().as_bytes());
    key.push(0);
    key.extend_from_slice(
        req.uri
            .path_and_query()
            .map_or(req.uri.path(), |p| p.as_str())
            .as_bytes(),
    );
    for name in &KEY_HEADERS {
        for value in req.headers.get_all(name) {
            key.push(0);
            key.extend_from_slice(name.as_str().as_bytes());
            key.push(b':');
            key.extend_from_slice(value.as_bytes());
        }
    }
    key.push(0);
    key.extend_from_slice(body);
    key
}

/// The layer (`axum::middleware::from_fn_with_state` with the shared [`Coalescer`]).
pub async fn layer(State(coalescer): State<Arc<Coalescer>>, req: Request, next: Next) -> Response {
    if !coalesced(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let post = req.method() == Method::POST;
    if post && declared.is_none_or(|n| n > MAX_BODY as u64) {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let body = if post {
        match super::read_body(body, MAX_BODY).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        }
    } else {
        Bytes::new()
    };
    let key = key_of(&parts, &body);
    let joined = {
        let mut open = coalescer.lock();
        match open.get(&key) {
            Some(group) => Err(group.answer.subscribe()),
            None => {
                let group = Arc::new(Group {
                    answer: watch::channel(None).0,
                    began: std::sync::atomic::AtomicBool::new(false),
                });
                open.insert(key.clone(), Arc::clone(&group));
                Ok(group)
            }
        }
    };
    let request = || Request::from_parts(parts.clone(), Body::from(body.clone()));
    match joined {
        Ok(group) => {
            let lead = Lead {
                coalescer: Arc::clone(&coalescer),
                key: Arc::new(key),
                group: Arc::clone(&group),
            };
            let closing = CloseOnDrop(lead.clone());
            let response = LEADING.scope(lead, next.run(request())).await;
            drop(closing);
            if !group.began.load(std::sync::atomic::Ordering::Acquire) {
                // Refused before its read (its network's share, a full queue, a bad
                // credential): that says nothing of the followers, who read alone.
                return response;
            }
            let (head, body) = response.into_parts();
            let Ok(body) = to_bytes(body, usize::MAX).await else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            };
            let shared = Arc::new(Shared {
                status: head.status,
                headers: head.headers,
                body,
            });
            group.answer.send_replace(Some(Arc::clone(&shared)));
            rebuild(&shared)
        }
        Err(mut waiting) => {
            let answer = waiting
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|a| a.as_ref().map(Arc::clone));
            match answer {
                Some(shared) => {
                    coalescer.followed.inc();
                    rebuild(&shared)
                }
                // The leader's request went away unanswered: read alone.
                None => next.run(request()).await,
            }
        }
    }
}

fn rebuild(shared: &Shared) -> Response {
    let mut response = Response::new(Body::from(shared.body.clone()));
    *response.status_mut() = shared.status;
    *response.headers_mut() = shared.headers.clone();
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::get;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::sync::Semaphore;

    /// A stand-in for a stats read: it waits for a slot the test gives, marks its read begun
    /// as `AppState::stats_slot` does, then waits at a second gate before answering with its
    /// read's number.
    #[derive(Clone)]
    struct Probe {
        slot: Arc<Semaphore>,
        gate: Arc<Semaphore>,
        reads: Arc<AtomicU64>,
    }

    /// Each permit the test gives lets one request through (taken, not given back).
    async fn pass(gate: &Semaphore) -> bool {
        gate.acquire().await.map(|p| p.forget()).is_ok()
    }

    async fn read(State(p): State<Probe>) -> Response {
        if !pass(&p.slot).await {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        started();
        let n = p.reads.fetch_add(1, Ordering::SeqCst) + 1;
        if !pass(&p.gate).await {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        ([("x-read", n.to_string())], format!("read {n}")).into_response()
    }

    /// A stats route that refuses before any read (as a full share does), after the gate.
    async fn refuse(State(p): State<Probe>) -> Response {
        p.reads.fetch_add(1, Ordering::SeqCst);
        pass(&p.gate).await;
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }

    impl Coalescer {
        fn open_groups(&self) -> usize {
            self.lock().len()
        }

        fn followers(&self) -> usize {
            self.lock()
                .values()
                .map(|g| g.answer.receiver_count())
                .sum()
        }
    }

    /// Until `done` holds (each check after the others have run a little); fails after 10 s.
    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if done() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("never: {what}");
    }

    #[tokio::test]
    async fn identical_waiting_requests_share_one_read_and_later_ones_read_anew() {
        let probe = Probe {
            slot: Arc::new(Semaphore::new(0)),
            gate: Arc::new(Semaphore::new(0)),
            reads: Arc::default(),
        };
        let followed = prometheus_client::metrics::counter::Counter::default();
        let coalescer = Arc::new(Coalescer::new(followed.clone()));
        let app = Router::new()
            .route("/api/v1/sites/{site}/top", get(read))
            .route("/other", get(read))
            .route("/api/v1/sites/{site}/events", get(refuse))
            .with_state(probe.clone())
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&coalescer),
                layer,
            ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let get = |path: &str, token: &str| {
            let req = http
                .get(format!("http://{addr}{path}"))
                .bearer_auth(token)
                .send();
            tokio::spawn(async move {
                let r = req.await.expect("answer");
                let status = r.status().as_u16();
                let read = r
                    .headers()
                    .get("x-read")
                    .map(|v| v.to_str().unwrap_or_default().to_owned());
                (status, read, r.text().await.expect("body"))
            })
        };
        let top = "/api/v1/sites/s/top?range=30d";

        // Eight identical requests wait for a slot: one leads, seven follow.
        let crowd: Vec<_> = (0..8).map(|_| get(top, "a")).collect();
        until("seven follow one leader", || {
            coalescer.open_groups() == 1 && coalescer.followers() == 7
        })
        .await;
        // Another credential is another request: a group of its own.
        let other_user = get(top, "b");
        until("a second group", || coalescer.open_groups() == 2).await;
        // A route this layer leaves alone never waits in a group.
        let plain = get("/other", "a");

        // The first leader takes its slot: its group closes before it reads.
        probe.slot.add_permits(1);
        until("the first read began", || {
            probe.reads.load(Ordering::SeqCst) == 1
        })
        .await;
        assert_eq!(coalescer.open_groups(), 1, "the crowd's group closed");
        // An identical request arriving now would miss hits acknowledged after that read
        // began: it starts a group of its own.
        let late = get(top, "a");
        until("the late request leads its own group", || {
            coalescer.open_groups() == 2
        })
        .await;

        probe.gate.add_permits(1);
        for answer in crowd {
            let (status, read, body) = answer.await.expect("task");
            assert_eq!(
                (status, read.as_deref(), body.as_str()),
                (200, Some("1"), "read 1")
            );
        }
        assert_eq!(followed.get(), 7);

        probe.slot.add_permits(3);
        probe.gate.add_permits(3);
        let mut later = Vec::new();
        for answer in [other_user, late, plain] {
            let (status, read, _) = answer.await.expect("task");
            assert_eq!(status, 200);
            later.push(read.expect("a read number"));
        }
        later.sort();
        assert_eq!(later, ["2", "3", "4"], "each read alone");
        assert_eq!(probe.reads.load(Ordering::SeqCst), 4);
        assert_eq!(followed.get(), 7);
        assert_eq!(coalescer.open_groups(), 0, "no group outlives its leader");

        // A leader refused before its read: its followers each run their own request.
        probe.reads.store(0, Ordering::SeqCst);
        let events = "/api/v1/sites/s/events?range=30d";
        let refused: Vec<_> = (0..3).map(|_| get(events, "a")).collect();
        until("two follow the refused leader", || {
            coalescer.followers() == 2
        })
        .await;
        probe.gate.add_permits(3);
        for answer in refused {
            assert_eq!(answer.await.expect("task").0, 503);
        }
        assert_eq!(
            probe.reads.load(Ordering::SeqCst),
            3,
            "each ran its own request"
        );
        assert_eq!(followed.get(), 7, "none took the refusal as its answer");
    }

    #[test]
    fn only_stats_reads_are_coalesced() {
        for (method, path, yes) in [
            (Method::GET, "/dashboard/blog", true),
            (Method::GET, "/dashboard/blog/login", false),
            (Method::GET, "/dashboard/", false),
            (Method::GET, "/api/v1/sites/blog/top/more", false),
            (Method::POST, "/dashboard/blog/login", false),
            (Method::GET, "/api/v1/sites/blog/series", true),
            (Method::GET, "/api/v1/sites/blog/top", true),
            (Method::GET, "/api/v1/sites/blog/events", true),
            (Method::GET, "/api/v1/sites/blog/filtered", true),
            (Method::POST, "/api/v1/sites/blog/top", false),
            (Method::POST, "/api/v2/query", true),
            (Method::GET, "/api/v2/query", false),
            (Method::GET, "/api/v1/counts", false),
            (Method::POST, "/api/v1/hit", false),
        ] {
            assert_eq!(coalesced(&method, path), yes, "{method} {path}");
        }
    }
}
