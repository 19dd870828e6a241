//! Answer headers set from facts of the request, as a plain tower layer.
//!
//! Contract: a [`HeaderRule`] reads what it needs from the request before the inner service
//! runs ([`HeaderRule::read`]) and writes headers into the inner service's answer
//! ([`HeaderRule::write`]); nothing else of the request or answer changes. Unlike
//! `axum::middleware::from_fn`, the layer neither clones the inner service nor boxes a future
//! per request: on the counting path every request pays each layer, so they are kept to a
//! function call (measured in a perf profile of the realistic load).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::http::{HeaderMap, Request, Response};
use tower::{Layer, Service};

/// What a header layer reads off a request and writes into its answer.
pub trait HeaderRule: Copy {
    /// What the answer's headers depend on.
    type Facts;
    /// Read the facts from the request, before it is handed on.
    fn read<B>(&self, request: &Request<B>) -> Self::Facts;
    /// Set the answer's headers.
    fn write(&self, facts: Self::Facts, headers: &mut HeaderMap);
}

/// The layer of a [`HeaderRule`].
#[derive(Debug, Clone, Copy)]
pub struct HeaderLayer<R>(pub R);

impl<S, R: HeaderRule> Layer<S> for HeaderLayer<R> {
    type Service = Headers<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Headers {
            inner,
            rule: self.0,
        }
    }
}

/// The service of a [`HeaderLayer`].
#[derive(Debug, Clone, Copy)]
pub struct Headers<S, R> {
    inner: S,
    rule: R,
}

impl<S, R, B, RB> Service<Request<B>> for Headers<S, R>
where
    S: Service<Request<B>, Response = Response<RB>>,
    R: HeaderRule,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = HeadersFuture<S::Future, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let facts = self.rule.read(&request);
        HeadersFuture {
            inner: self.inner.call(request),
            rule: self.rule,
            facts: Some(facts),
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of the inner service, with the rule's headers set.
    pub struct HeadersFuture<F, R: HeaderRule> {
        #[pin]
        inner: F,
        rule: R,
        facts: Option<R::Facts>,
    }
}

impl<F, R, RB, E> Future for HeadersFuture<F, R>
where
    F: Future<Output = Result<Response<RB>, E>>,
    R: HeaderRule,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        if let Some(facts) = this.facts.take() {
            this.rule.write(facts, response.headers_mut());
        }
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue};
    use tower::ServiceExt;

    /// Copies the request's `x-in` into the answer's `x-out`.
    #[derive(Clone, Copy)]
    struct Echo;

    impl HeaderRule for Echo {
        type Facts = Option<HeaderValue>;
        fn read<B>(&self, request: &Request<B>) -> Self::Facts {
            request.headers().get("x-in").cloned()
        }
        fn write(&self, facts: Self::Facts, headers: &mut HeaderMap) {
            if let Some(v) = facts {
                headers.insert(HeaderName::from_static("x-out"), v);
            }
        }
    }

    #[tokio::test]
    async fn the_rule_sees_the_request_and_sets_the_answer() {
        let inner = tower::service_fn(|_: Request<()>| async {
            let mut r = Response::new(());
            r.headers_mut()
                .insert("x-kept", HeaderValue::from_static("1"));
            Ok::<_, std::convert::Infallible>(r)
        });
        let service = HeaderLayer(Echo).layer(inner);
        let request = Request::builder()
            .header("x-in", "hello")
            .body(())
            .expect("a valid request");
        let response = service.oneshot(request).await.expect("infallible");
        assert_eq!(response.headers()["x-out"], "hello");
        assert_eq!(
            response.headers()["x-kept"],
            "1",
            "the inner answer is kept"
        );
        let response = HeaderLayer(Echo)
            .layer(tower::service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(Response::new(()))
            }))
            .oneshot(Request::new(()))
            .await
            .expect("infallible");
        assert!(response.headers().get("x-out").is_none());
    }
}
