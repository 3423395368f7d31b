//! The recording proxy's upstream client: one per HTTP worker, made from [`UpstreamConfig`].
//! The providers' side of the proxy: one HTTP/1.1 client (hyper-util's pooled client over
//! native TLS) per HTTP worker, each provider's chat-completions endpoint, and the two
//! timeouts of a call.
//!
//! The proxy calls hyper directly rather than through reqwest: a proxied call needs none of
//! what reqwest adds on top (redirects, which a proxy must not follow; retries; URL objects;
//! decompression), and those layers cost about a fifth of keel's own CPU per proxied call
//! (docs/DECISIONS.md, record 49). Every other outbound call of keel uses reqwest.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper_tls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::{Instant, Sleep};

use keel_core::domain::PROVIDERS;
use keel_core::peer::{causes, CallFailure};

type Connector = HttpsConnector<HttpConnector>;

/// What every HTTP worker's provider client is made from, built once at startup: each
/// provider's chat-completions endpoint, the TLS configuration (keel's one, `AppState`) and
/// the two timeouts.
#[derive(Clone)]
pub struct UpstreamConfig {
    tls: tokio_native_tls::TlsConnector,
    /// `<base>/chat/completions` of each of [`PROVIDERS`], in that order.
    endpoints: Arc<[http::Uri]>,
    /// Each provider's base, without a trailing `/` (the relay appends the path).
    bases: Arc<[String]>,
    /// Each base as errors show it: without user information.
    shown: Arc<[String]>,
    connect_timeout: Duration,
    read_timeout: Duration,
    pool_idle_timeout: Duration,
}

impl UpstreamConfig {
    /// The base URLs are http(s) (`Settings::validate`); each must also make an absolute URI.
    pub fn new(
        settings: &keel_core::config::Settings,
        tls: native_tls::TlsConnector,
    ) -> anyhow::Result<Self> {
        let p = &settings.providers;
        let base_of = |provider: &str| match provider {
            "anthropic" => &p.anthropic_url,
            "openrouter" => &p.openrouter_url,
            "google" => &p.google_url,
            _ => &p.openai_url,
        };
        let bases: Arc<[String]> = PROVIDERS
            .iter()
            .map(|provider| base_of(provider).trim_end_matches('/').to_owned())
            .collect();
        let shown = bases.iter().map(|base| without_user_information(base)).collect();
        let endpoints = PROVIDERS
            .iter()
            .map(|provider| {
                let base = base_of(provider);
                let endpoint = format!("{}/chat/completions", base.trim_end_matches('/'));
                endpoint
                    .parse::<http::Uri>()
                    .ok()
                    .filter(|uri| uri.scheme().is_some() && uri.host().is_some())
                    .ok_or_else(|| anyhow::anyhow!("the {provider} base URL {base:?} is not an absolute URL"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            tls: tokio_native_tls::TlsConnector::from(tls),
            endpoints,
            bases,
            shown,
            connect_timeout: Duration::from_millis(settings.proxy.connect_timeout_ms),
            read_timeout: Duration::from_secs(settings.proxy.read_timeout_secs),
            pool_idle_timeout: Duration::from_millis(settings.proxy.pool_idle_timeout_ms),
        })
    }

    /// The providers through a client (and connection pool) of its own, for one HTTP worker:
    /// a pooled connection is served by a task on the worker that opened it, so a client
    /// shared by the workers would send about half the calls through another worker's
    /// thread, two thread wake-ups (there and back) per proxied call. Pooled, with a connect
    /// timeout and a read timeout (no total timeout: a long stream is fine as long as it
    /// keeps talking). Redirects are not followed: a proxy answers the provider's 3xx as it
    /// is, like any other status.
    pub fn for_worker(&self) -> Upstreams {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(self.connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            // A connection idle this long is not reused: the provider may be closing it.
            .pool_idle_timeout(self.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .build(HttpsConnector::from((http, self.tls.clone())));
        Upstreams {
            client,
            endpoints: self.endpoints.clone(),
            bases: self.bases.clone(),
            shown: self.shown.clone(),
            read_timeout: self.read_timeout,
        }
    }
}

/// One HTTP worker's way to the providers ([`UpstreamConfig::for_worker`]).
pub struct Upstreams {
    client: Client<Connector, Full<Bytes>>,
    endpoints: Arc<[http::Uri]>,
    bases: Arc<[String]>,
    shown: Arc<[String]>,
    read_timeout: Duration,
}

impl Upstreams {
    pub fn endpoint(&self, provider: usize) -> &http::Uri {
        &self.endpoints[provider]
    }

    /// The provider's base URL as errors show it (to the caller, and in the trace): without
    /// any user information it was configured with.
    pub fn base(&self, provider: usize) -> &str {
        &self.shown[provider]
    }

    /// `<base><path>?<query>` for the relay; 400 when that is no URI.
    pub fn relay_uri(
        &self,
        provider: usize,
        path: &str,
        query: &str,
    ) -> Result<http::Uri, crate::error::ApiError> {
        let mut uri = format!("{}{path}", self.bases[provider]);
        if !query.is_empty() {
            uri.push('?');
            uri.push_str(query);
        }
        uri.parse()
            .map_err(|_| crate::error::ApiError::BadRequest(format!("cannot relay to {uri}")))
    }

    /// Sends `request` and waits for the answer's head, at most the read timeout. A failure
    /// is logged with its cause (the caller's 502 or 504 names only its kind).
    pub async fn send(&self, request: http::Request<Full<Bytes>>) -> Result<Answer, CallFailure> {
        // Kept for the log of a failure (a clone shares the URI's bytes).
        let uri = request.uri().clone();
        let failure = match tokio::time::timeout(self.read_timeout, self.client.request(request)).await {
            Ok(Ok(response)) => {
                let (head, incoming) = response.into_parts();
                return Ok(Answer {
                    head,
                    body: Body::new(incoming, self.read_timeout),
                });
            }
            Ok(Err(err)) => {
                let failure = if timed_out(&err) {
                    CallFailure::Timeout
                } else if err.is_connect() {
                    CallFailure::Unreachable
                } else {
                    CallFailure::Failed
                };
                (failure, causes(&err))
            }
            Err(_) => (
                CallFailure::Timeout,
                "no answer within the read timeout".to_owned(),
            ),
        };
        // The host and port only: a base URL's user information is never logged.
        let (host, port) = (uri.host().unwrap_or_default(), uri.port_u16());
        tracing::warn!(host, port, failure = ?failure.0, cause = %failure.1, "calling the provider failed");
        Err(failure.0)
    }
}

/// A provider's answer: its head, and its body still to be read.
pub struct Answer {
    pub head: http::response::Parts,
    pub body: Body,
}

/// `base` without a user name or password (`https://ops:pw@host/v1` → `https://host/v1`).
fn without_user_information(base: &str) -> String {
    match url::Url::parse(base) {
        Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.as_str().trim_end_matches('/').to_owned()
        }
        _ => base.to_owned(),
    }
}

/// Whether a timeout (the connect timeout's, or the system's) lies anywhere in the chain.
fn timed_out(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(err) = source {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// An answer's body, chunk by chunk as it arrives; a wait for the next chunk longer than the
/// read timeout ends it with [`CallFailure::Timeout`]. Dropped before its end, it drops
/// the connection (the provider's call is cancelled).
pub struct Body {
    incoming: Incoming,
    read_timeout: Duration,
    /// When the awaited chunk is overdue; made when the first wait begins.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The deadline counts the current wait (it is set anew when a wait begins, so time
    /// the caller takes between chunks, a slow client's, is not the provider's).
    waiting: bool,
    done: bool,
}

impl Body {
    fn new(incoming: Incoming, read_timeout: Duration) -> Self {
        Self {
            incoming,
            read_timeout,
            deadline: None,
            waiting: false,
            done: false,
        }
    }

    /// The whole body (a body that arrives in one chunk is not copied).
    pub async fn collect(mut self) -> Result<Bytes, CallFailure> {
        use futures_util::StreamExt;
        let Some(first) = self.next().await.transpose()? else {
            return Ok(Bytes::new());
        };
        let Some(second) = self.next().await.transpose()? else {
            return Ok(first);
        };
        let mut all = BytesMut::with_capacity(first.len() + second.len());
        all.extend_from_slice(&first);
        all.extend_from_slice(&second);
        while let Some(chunk) = self.next().await.transpose()? {
            all.extend_from_slice(&chunk);
        }
        Ok(all.freeze())
    }
}

impl Stream for Body {
    type Item = Result<Bytes, CallFailure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers carry no data: wait on for the next frame.
                    if let Ok(data) = frame.into_data() {
                        this.waiting = false;
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Poll::Ready(Some(Err(err))) => {
                    this.done = true;
                    let failure = match timed_out(&err) {
                        true => CallFailure::Timeout,
                        false => CallFailure::Failed,
                    };
                    tracing::warn!(failure = ?failure, cause = %causes(&err), "reading the provider's answer failed");
                    return Poll::Ready(Some(Err(failure)));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    let read_timeout = this.read_timeout;
                    let deadline = this
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(read_timeout)));
                    if !this.waiting {
                        deadline.as_mut().reset(Instant::now() + read_timeout);
                    }
                    this.waiting = true;
                    ready!(deadline.as_mut().poll(cx));
                    this.done = true;
                    return Poll::Ready(Some(Err(CallFailure::Timeout)));
                }
            }
        }
    }
}
