//! In-process fake servers (small actix apps on port 0) that record what they receive.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

/// Binds a fake on port 0, serves it in the current actix system, answers its base URL.
pub fn serve<F>(configure: F) -> String
where
    F: Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = HttpServer::new(move || App::new().configure(configure.clone()))
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
    actix_web::rt::spawn(server);
    format!("http://127.0.0.1:{port}")
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub form: HashMap<String, String>,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
pub struct StripeState {
    pub requests: Vec<Recorded>,
    /// Payment intents created, by idempotency key (a retried key creates nothing new).
    pub intents: HashMap<String, Value>,
    pub fail_customer_delete: bool,
}

#[derive(Clone, Default)]
pub struct FakeStripe {
    pub state: Arc<Mutex<StripeState>>,
}

impl FakeStripe {
    pub fn start() -> (Self, String) {
        let fake = Self::default();
        let data = web::Data::new(fake.clone());
        let url = serve(move |cfg: &mut web::ServiceConfig| {
            cfg.app_data(data.clone())
                .default_service(web::to(stripe_handler));
        });
        (fake, url)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn charges(&self) -> usize {
        self.state.lock().unwrap().intents.len()
    }
}

async fn stripe_handler(req: HttpRequest, body: web::Bytes, fake: web::Data<FakeStripe>) -> HttpResponse {
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let recorded = Recorded {
        method: req.method().to_string(),
        path: req.path().to_owned(),
        form: form.clone(),
        idempotency_key: header("idempotency-key"),
        authorization: header("authorization"),
    };
    let mut state = fake.state.lock().unwrap();
    state.requests.push(recorded.clone());
    let path = req.path().to_owned();
    let parts: Vec<&str> = path.trim_start_matches("/v1/").split('/').collect();
    match (req.method().as_str(), parts.as_slice()) {
        ("POST", ["customers"]) => HttpResponse::Ok().json(json!({"id": "cus_fake_1", "object": "customer"})),
        ("POST", ["customers", id]) => HttpResponse::Ok().json(json!({"id": id, "object": "customer"})),
        ("DELETE", ["customers", id]) => {
            if state.fail_customer_delete {
                HttpResponse::InternalServerError()
                    .json(json!({"error": {"type": "api_error", "message": "Stripe is down"}}))
            } else {
                HttpResponse::Ok().json(json!({"id": id, "deleted": true}))
            }
        }
        ("POST", ["setup_intents"]) => {
            HttpResponse::Ok().json(json!({"id": "seti_fake", "client_secret": "seti_fake_secret_abc"}))
        }
        ("POST", ["payment_methods", pm, "attach"]) => {
            if pm.starts_with("pm_unknown") {
                HttpResponse::NotFound().json(json!({"error": {"type": "invalid_request_error", "code": "resource_missing", "message": "No such PaymentMethod"}}))
            } else {
                HttpResponse::Ok().json(json!({"id": pm, "card": {"brand": "mastercard", "last4": "4444", "exp_month": 1, "exp_year": 2031}}))
            }
        }
        ("POST", ["payment_methods", pm, "detach"]) => HttpResponse::Ok().json(json!({"id": pm})),
        ("POST", ["payment_intents"]) => {
            if form.get("payment_method").map(String::as_str) == Some("pm_decline") {
                return HttpResponse::PaymentRequired().json(json!({"error": {"type": "card_error", "code": "card_declined", "message": "Your card was declined.", "payment_intent": {"id": "pi_declined_1"}}}));
            }
            let key = recorded.idempotency_key.unwrap_or_default();
            let next = state.intents.len() + 1;
            let intent = state
                .intents
                .entry(key)
                .or_insert_with(|| json!({"id": format!("pi_fake_{next}"), "status": "succeeded", "amount": form.get("amount")}))
                .clone();
            HttpResponse::Ok().json(intent)
        }
        _ => HttpResponse::NotFound()
            .json(json!({"error": {"type": "invalid_request_error", "message": "unknown route"}})),
    }
}

/// One request a [`FakeJson`] received.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub headers: HashMap<String, String>,
    pub body: Value,
    /// The query string as received.
    pub query: String,
    /// The body's bytes as received.
    pub raw: Vec<u8>,
}

/// What a [`FakeJson`] answers.
pub enum Reply {
    Json(u16, Value),
    /// A status with an empty body (an OTLP collector's success).
    Empty(u16),
    /// Never answers in any test's patience (the caller's timeout must fire).
    Hang,
}

type Responder = Arc<dyn Fn(&Call) -> Reply + Send + Sync>;

/// A JSON server (serving layer, hub, tracker) that records every request and answers
/// through a closure.
#[derive(Clone)]
pub struct FakeJson {
    calls: Arc<Mutex<Vec<Call>>>,
    responder: Responder,
}

impl FakeJson {
    pub fn start(responder: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> (Self, String) {
        let fake = Self {
            calls: Arc::default(),
            responder: Arc::new(responder),
        };
        let data = web::Data::new(fake.clone());
        let url = serve(move |cfg: &mut web::ServiceConfig| {
            cfg.app_data(data.clone()).default_service(web::to(json_handler));
        });
        (fake, url)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

async fn json_handler(req: HttpRequest, body: web::Bytes, fake: web::Data<FakeJson>) -> HttpResponse {
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let call = Call {
        method: req.method().to_string(),
        path: req.path().to_owned(),
        authorization: headers.get("authorization").cloned(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        query: req.query_string().to_owned(),
        raw: body.to_vec(),
    };
    fake.calls.lock().unwrap().push(call.clone());
    match (fake.responder)(&call) {
        Reply::Json(status, body) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).json(body)
        }
        Reply::Empty(status) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).finish()
        }
        Reply::Hang => {
            actix_web::rt::time::sleep(std::time::Duration::from_secs(30)).await;
            HttpResponse::Ok().json(json!({}))
        }
    }
}

/// A base URL nothing listens on.
pub fn closed_port_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// A fake LLM provider: answers by the request's `model` with the shared fixtures (JSON, or
/// SSE sent in small pieces), and records what it received.
#[derive(Clone)]
pub struct FakeProvider {
    calls: Arc<Mutex<Vec<Call>>>,
    /// `stream-gated` sends its first frame, then waits for a permit here.
    pub gate: Arc<tokio::sync::Semaphore>,
    /// Set when a `stream-endless` response is dropped (the proxy hung up on it).
    pub cancelled: Arc<std::sync::atomic::AtomicBool>,
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/chat/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl FakeProvider {
    pub fn start() -> (Self, String) {
        let fake = Self {
            calls: Arc::default(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
            cancelled: Arc::default(),
        };
        let data = web::Data::new(fake.clone());
        let url = serve(move |cfg: &mut web::ServiceConfig| {
            cfg.app_data(data.clone())
                .default_service(web::to(provider_handler));
        });
        (fake, url)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

fn sse(bytes: Vec<u8>) -> HttpResponse {
    let pieces: Vec<Result<web::Bytes, actix_web::Error>> = bytes
        .chunks(17)
        .map(|c| Ok(web::Bytes::copy_from_slice(c)))
        .collect();
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("x-request-id", "req_fake_stream"))
        .streaming(futures_util::stream::iter(pieces))
}

async fn provider_handler(req: HttpRequest, body: web::Bytes, fake: web::Data<FakeProvider>) -> HttpResponse {
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let call = Call {
        method: req.method().to_string(),
        path: req.path().to_owned(),
        authorization: headers.get("authorization").cloned(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        query: req.query_string().to_owned(),
        raw: body.to_vec(),
    };
    fake.calls.lock().unwrap().push(call.clone());
    // The other OpenAI endpoints the relay reaches.
    if req.path().ends_with("/models") && req.method() == actix_web::http::Method::GET {
        return HttpResponse::Ok().insert_header(("x-request-id", "req_models")).json(json!({
            "object": "list",
            "data": [{"id": "gpt-4o-mini", "object": "model", "created": 1721172741, "owned_by": "system"}],
        }));
    }
    if req.path().ends_with("/embeddings") {
        return HttpResponse::Ok().json(json!({
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.0023, -0.0093, 0.0158]}],
            "model": call.body["model"],
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
        }));
    }
    // The scripted `stream-*` models answer below as they do on every path.
    let scripted = call.body["model"]
        .as_str()
        .is_some_and(|m| m.starts_with("stream-"));
    if req.path().ends_with("/responses") && !scripted {
        if call.body["stream"] == json!(true) {
            return sse(std::fs::read(format!(
                "{}/tests/fixtures/relay/responses_stream.sse",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap());
        }
        return HttpResponse::Ok().json(json!({
            "id": "resp_1", "object": "response", "status": "completed", "model": call.body["model"],
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]}],
            "usage": {"input_tokens": 20, "output_tokens": 5, "total_tokens": 25},
        }));
    }
    if req.path().ends_with("/files") {
        return HttpResponse::Ok().json(json!({
            "id": "file-abc123", "object": "file", "bytes": call.raw.len(), "filename": "train.jsonl", "purpose": "fine-tune",
        }));
    }
    let json_reply = |status: u16, name: &str| {
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
            .content_type("application/json")
            .insert_header(("x-request-id", "req_fake_1"))
            .insert_header(("openai-processing-ms", "7"))
            .body(fixture(name))
    };
    match call.body["model"].as_str().unwrap_or_default() {
        "gpt-tool" => json_reply(200, "completion_tool_call.json"),
        "gpt-multimodal" => json_reply(200, "completion_multimodal_content.json"),
        "gpt-401" => json_reply(401, "error_401.json"),
        // A redirect to a path of this fake that answers 200: followed, it would show up as a
        // second call.
        "gpt-moved" => HttpResponse::TemporaryRedirect()
            .insert_header(("location", "/moved/v1/chat/completions"))
            .content_type("application/json")
            .body(r#"{"error":{"message":"moved","type":"invalid_request_error"}}"#),
        // Echoes the provider key back, with a secret-named field: the caller gets it as sent,
        // the stored trace must not keep it.
        "gpt-leaky" => {
            let key = call
                .authorization
                .clone()
                .unwrap_or_default()
                .replace("Bearer ", "");
            HttpResponse::Ok().json(json!({
                "id": "chatcmpl-leaky", "object": "chat.completion", "model": "gpt-leaky",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": format!("your key is {key}")}}],
                "session_token": "tok_live_abcdef",
                "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
            }))
        }
        "gpt-slow" => {
            actix_web::rt::time::sleep(std::time::Duration::from_secs(5)).await;
            json_reply(200, "completion_plain.json")
        }
        "stream-plain" => sse(fixture("stream_plain_with_usage.sse")),
        "stream-tools" => sse(fixture("stream_two_tool_calls_no_usage.sse")),
        "stream-crlf" => sse(fixture("stream_router_comments_crlf.sse")),
        "stream-gated" => {
            let bytes = fixture("stream_plain_with_usage.sse");
            let split = bytes.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
            let (first, rest) = (
                web::Bytes::copy_from_slice(&bytes[..split]),
                web::Bytes::copy_from_slice(&bytes[split..]),
            );
            let gate = fake.gate.clone();
            let stream = futures_util::stream::unfold(0, move |step| {
                let (gate, first, rest) = (gate.clone(), first.clone(), rest.clone());
                async move {
                    match step {
                        0 => Some((Ok::<_, actix_web::Error>(first), 1)),
                        1 => {
                            gate.acquire().await.unwrap().forget();
                            Some((Ok(rest), 2))
                        }
                        _ => None,
                    }
                }
            });
            HttpResponse::Ok()
                .content_type("text/event-stream")
                .streaming(stream)
        }
        "stream-endless" => {
            let guard = Arc::new(SetOnDrop(fake.cancelled.clone()));
            let stream = futures_util::stream::unfold(0u64, move |n| {
                let _guard = guard.clone();
                async move {
                    if n > 0 {
                        actix_web::rt::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                    let frame = format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"stream-endless\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tick{n} \"}}}}]}}\n\n"
                    );
                    Some((Ok::<_, actix_web::Error>(web::Bytes::from(frame)), n + 1))
                }
            });
            HttpResponse::Ok()
                .content_type("text/event-stream")
                .streaming(stream)
        }
        _ => json_reply(200, "completion_plain.json"),
    }
}

/// A TCP proxy in front of a server (PostgreSQL) that a test cuts and restores, as a restart
/// would: cut, every open connection is closed and the port refuses connections.
pub struct CuttableProxy {
    target: std::net::SocketAddr,
    accepting: Mutex<Option<actix_web::rt::task::JoinHandle<()>>>,
    cuts: tokio::sync::watch::Sender<u64>,
    pub port: u16,
}

impl CuttableProxy {
    pub async fn start(target: std::net::SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cuts, _) = tokio::sync::watch::channel(0u64);
        let proxy = Self {
            target,
            accepting: Mutex::new(None),
            cuts,
            port,
        };
        proxy.accept_on(listener);
        proxy
    }

    fn accept_on(&self, listener: tokio::net::TcpListener) {
        let (target, cuts) = (self.target, self.cuts.clone());
        let task = actix_web::rt::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut cut = cuts.subscribe();
                actix_web::rt::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        *self.accepting.lock().unwrap() = Some(task);
    }

    /// Closes every connection and the listener (connections are refused).
    pub fn cut(&self) {
        if let Some(task) = self.accepting.lock().unwrap().take() {
            task.abort();
        }
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Listens on the same port again.
    pub async fn restore(&self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .unwrap();
        self.accept_on(listener);
    }
}

/// A provider written at the TCP level, for answers an HTTP framework will not give: a body
/// cut at any point (chunked, sized or delimited by the connection's close), a stall, odd
/// content types. The request's `model` picks the script; each connection's close is noted
/// (when keel dropped the call).
#[derive(Clone, Default)]
pub struct RawProvider {
    /// The `model` of each request, in order.
    pub models: Arc<Mutex<Vec<String>>>,
    /// Each request's body as received.
    pub bodies: Arc<Mutex<Vec<Value>>>,
    /// When keel closed a connection the script was holding open (silent scripts).
    pub closed_at: Arc<Mutex<Vec<std::time::Instant>>>,
}

/// A chunk of a chat stream, as a provider frames it.
pub fn chunk_frame(content: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-raw\",\"object\":\"chat.completion.chunk\",\"created\":1763683210,\"model\":\"gpt-raw\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

pub const FINISH: &str = "data: {\"id\":\"chatcmpl-raw\",\"object\":\"chat.completion.chunk\",\"created\":1763683210,\"model\":\"gpt-raw\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
pub const USAGE: &str = "data: {\"id\":\"chatcmpl-raw\",\"object\":\"chat.completion.chunk\",\"created\":1763683210,\"model\":\"gpt-raw\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n";

impl RawProvider {
    pub fn start() -> (Self, String) {
        let fake = Self::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = fake.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(shared.clone().serve(stream));
                }
            });
        });
        (fake, url)
    }

    async fn serve(self, mut stream: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut request = Vec::new();
        let mut buf = [0u8; 8192];
        let head_end = loop {
            let Ok(n) = stream.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            request.extend_from_slice(&buf[..n]);
            if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
        };
        let head = String::from_utf8_lossy(&request[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while request.len() < head_end + length {
            let Ok(n) = stream.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            request.extend_from_slice(&buf[..n]);
        }
        let body: Value = serde_json::from_slice(&request[head_end..]).unwrap_or(Value::Null);
        let model = body["model"].as_str().unwrap_or_default().to_owned();
        self.models.lock().unwrap().push(model.clone());
        self.bodies.lock().unwrap().push(body.clone());
        let three: String = ["tok0 ", "tok1 ", "tok2 "]
            .iter()
            .map(|t| chunk_frame(t))
            .collect();
        let sse_head =
            |extra: &str| format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{extra}\r\n");
        let chunked = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
        let answer: Vec<u8> = match model.as_str() {
            // Close-delimited: no length, no chunks; the connection's close ends the body.
            "cut-close" => (sse_head("connection: close\r\n") + &three).into_bytes(),
            // Chunked, and the connection closes without the last chunk.
            "cut-chunked" => (sse_head("transfer-encoding: chunked\r\n") + &chunked(&three)).into_bytes(),
            // A length, and fewer bytes.
            "cut-sized" => {
                (sse_head(&format!("content-length: {}\r\n", three.len() + 500)) + &three).into_bytes()
            }
            // An error frame in the stream, then [DONE].
            "error-frame" => {
                let frames = chunk_frame("tok0 ")
                    + "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"code\":null}}\n\n"
                    + "data: [DONE]\n\n";
                (sse_head(&format!("content-length: {}\r\n", frames.len())) + &frames).into_bytes()
            }
            // A whole stream under an odd content type (or none).
            "odd-case" | "no-type" | "ndjson" => {
                let frames = three.clone() + FINISH + USAGE + "data: [DONE]\n\n";
                let content_type = match model.as_str() {
                    "odd-case" => "content-type: Text/Event-Stream; charset=utf-8\r\n",
                    "ndjson" => "content-type: application/x-ndjson\r\n",
                    _ => "",
                };
                format!(
                    "HTTP/1.1 200 OK\r\n{content_type}content-length: {}\r\n\r\n{frames}",
                    frames.len()
                )
                .into_bytes()
            }
            // An error as JSON answering a streamed request.
            "json-error" => {
                let error = r#"{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}"#;
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{error}",
                    error.len()
                )
                .into_bytes()
            }
            // A complete stream that never says its usage.
            "no-usage" => {
                let frames = three.clone() + FINISH + "data: [DONE]\n\n";
                (sse_head(&format!("content-length: {}\r\n", frames.len())) + &frames).into_bytes()
            }
            // A complete stream, its usage chunk only when asked for.
            "whole" => {
                let asked = body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
                let frames = three.clone() + FINISH + if asked { USAGE } else { "" } + "data: [DONE]\n\n";
                (sse_head(&format!("content-length: {}\r\n", frames.len())) + &frames).into_bytes()
            }
            // Frames of 64 KiB as fast as keel takes them, until it stops taking them.
            "firehose" => {
                let _ = stream
                    .write_all(sse_head("transfer-encoding: chunked\r\n").as_bytes())
                    .await;
                let frame = chunk_frame(&"x".repeat(64 * 1024));
                let chunk = chunked(&frame);
                loop {
                    let write = stream.write_all(chunk.as_bytes());
                    match tokio::time::timeout(std::time::Duration::from_secs(60), write).await {
                        Ok(Ok(())) => {}
                        _ => break,
                    }
                }
                self.closed_at.lock().unwrap().push(std::time::Instant::now());
                return;
            }
            // One frame, then silence, with the connection held open until keel closes it.
            "silent" => {
                let _ = stream
                    .write_all(
                        (sse_head("transfer-encoding: chunked\r\n") + &chunked(&chunk_frame("tok0 ")))
                            .as_bytes(),
                    )
                    .await;
                let mut sink = [0u8; 1024];
                loop {
                    match stream.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                self.closed_at.lock().unwrap().push(std::time::Instant::now());
                return;
            }
            _ => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
        };
        let _ = stream.write_all(&closing(answer)).await;
        let _ = stream.shutdown().await;
    }
}

/// `answer` saying `connection: close` (unless it does already): this fake ends every
/// connection after one answer, and a server that does must say so (RFC 9112, 9.6), or a
/// client's pool may send its next request into the closing connection.
fn closing(answer: Vec<u8>) -> Vec<u8> {
    let Some(line_end) = answer.windows(2).position(|w| w == b"\r\n") else {
        return answer;
    };
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    if String::from_utf8_lossy(&answer[..head_end])
        .to_lowercase()
        .contains("\r\nconnection:")
    {
        return answer;
    }
    let mut closing = answer[..line_end + 2].to_vec();
    closing.extend_from_slice(b"connection: close\r\n");
    closing.extend_from_slice(&answer[line_end + 2..]);
    closing
}
