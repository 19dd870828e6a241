//! Request and answer bodies of the server loop.
//!
//! Contract: a request body must arrive within its deadline (`body_timeout` after its head);
//! once the deadline passes with the body unfinished, every read fails with [`BodyTimeout`]
//! and the service replaces the handler's answer by [`request_timeout`] (408, and
//! `Connection: close` over HTTP/1). An answer's body holds its request open (the connection's
//! idle clock stops, its answer clock runs) and its address's request share until hyper has
//! sent or dropped it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Response, StatusCode, Version, header};
use axum::response::IntoResponse;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tally_wire::ErrorBody;
use tokio::time::{Instant, Sleep};

use super::activity::RequestGuard;
use crate::core::net::Share;

/// The 408 that replaces whatever the handler made of a body that did not arrive in time.
pub(crate) fn request_timeout(version: Version, after: Duration) -> Response<Body> {
    let body = ErrorBody {
        error: "request_timeout".to_owned(),
        message: format!(
            "the request body did not arrive within {} s",
            after.as_secs_f64()
        ),
    };
    let mut response = (StatusCode::REQUEST_TIMEOUT, Json(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if version <= Version::HTTP_11 {
        // The rest of the body may still be on its way: this connection cannot be reused.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The 503 for a request past its address's share of open requests (see [`super::share`]).
/// Its body, if any, is not read: over HTTP/1 the connection closes after the answer.
pub(crate) fn too_many_requests(version: Version) -> Response<Body> {
    let body = ErrorBody {
        error: "too_many_requests".to_owned(),
        message: "too many requests open from your address; retry shortly".to_owned(),
    };
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    if version <= Version::HTTP_11 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that fails once its deadline passes while the client is still sending it.
pub(crate) struct TimedBody {
    inner: Incoming,
    deadline: Instant,
    /// Created on the first wait, so requests without a body never arm a timer.
    timer: Option<Pin<Box<Sleep>>>,
    /// Tells the service to answer 408 whatever the handler made of the failure.
    timed_out: Arc<AtomicBool>,
}

impl TimedBody {
    /// `inner`, failing after `deadline`; `timed_out` is set when it does.
    pub fn new(inner: Incoming, deadline: Instant, timed_out: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            deadline,
            timer: None,
            timed_out,
        }
    }
}

/// The error a handler's body read sees after `body_timeout` (in its source chain); whatever
/// the handler answers is then replaced by the 408.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimeout;

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        if this.timed_out.load(Ordering::Relaxed) {
            return Poll::Ready(Some(Err(BodyTimeout.into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(BodyTimeout.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An answer's body, holding its request open (and its place in its address's share) until
/// hyper has sent it or dropped it.
pub(crate) struct Answer {
    body: Body,
    _open: RequestGuard,
    _share: Option<Share>,
}

impl Answer {
    pub fn new(body: Body, open: RequestGuard, share: Option<Share>) -> Self {
        Self {
            body,
            _open: open,
            _share: share,
        }
    }
}

impl HttpBody for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
