//! HTTP server: OpenAI- and Anthropic-compatible endpoints over one loaded model.
//!
//! Requests are parsed and rendered on the async executor; generation runs on the engine's
//! scheduler thread ([`crate::engine::scheduler`]), which advances up to `parallel` requests
//! round-robin, one step each, behind a deep FIFO wait queue (503 with `Retry-After` only past it).
//! Every request carries a cancel flag that is raised when its response (body or SSE stream) is
//! dropped, so a client that goes away stops its generation (and frees its slot) within one step.

pub mod anthropic;
pub mod error;
pub mod logprobs;
pub mod metrics;
pub mod openai;
pub mod prompt;
pub mod responses;
pub mod structured;
pub mod testing;
pub mod webui;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::sync::mpsc;
use tower_http::cors::CorsLayer;

use crate::chat::ChatTemplate;
use crate::engine::Backend;
use crate::engine::generate::{GenEvent, GenOutput, GenerateError, GenerateRequest};
use crate::engine::generation::GenerationOptions;
use crate::engine::scheduler::{Scheduler, SchedulerConfig, Submission, SubmitError};
use crate::sampler::SamplingParams;
use crate::sampler::logprobs::TokenLogprobs;
use crate::tokenizer::Tokenizer;
pub use error::{ApiError, Flavor};
use metrics::Metrics;

/// Request bodies above this are refused with 413.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub use crate::engine::scheduler::{DEFAULT_PARALLEL, DEFAULT_QUEUE};

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// When set, every route but `/health` needs `Authorization: Bearer KEY` or `x-api-key: KEY`.
    pub api_key: Option<String>,
    /// Requests allowed to wait while `parallel` generate; more are refused with 503.
    pub queue_capacity: usize,
    /// Requests generating concurrently (advanced step by step together); 0: the backend's
    /// default ([`crate::engine::Backend::default_parallel`]).
    pub parallel: usize,
    /// Bytes the prompt cache's sequences may hold together (0 turns the cache off).
    pub prompt_cache_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            queue_capacity: DEFAULT_QUEUE,
            parallel: 0,
            prompt_cache_bytes: crate::engine::cache::DEFAULT_CACHE_BYTES,
        }
    }
}

/// Everything needed to serve one model.
pub struct LoadedModel {
    pub name: String,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// Sampling used for fields a request leaves out (from the GGUF, else 0.6 / 0.95 / 20).
    pub defaults: SamplingParams,
    pub context_length: usize,
    pub vocab_size: usize,
    /// The backend's own description ("cpu" or "gpu (<adapter name>)").
    pub backend_name: String,
    backend: Arc<dyn Backend>,
    /// Started by [`AppState::set_model`] with the server's configuration.
    scheduler: Option<Scheduler>,
    /// Structured-output grammar compiler for this tokenizer, built on first use.
    grammars: std::sync::OnceLock<Result<structured::Grammars, String>>,
}

impl LoadedModel {
    /// Requests its backend advances together by default (`--parallel` unset).
    pub fn default_parallel(&self) -> usize {
        self.backend.default_parallel()
    }

    pub fn new(
        name: impl Into<String>,
        backend: Arc<dyn Backend>,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        defaults: SamplingParams,
    ) -> LoadedModel {
        let context_length = backend.info().context_length;
        let vocab_size = backend.info().vocab_size;
        LoadedModel {
            backend_name: backend.info().backend.clone(),
            vocab_size,
            name: name.into(),
            tokenizer,
            template,
            defaults,
            context_length,
            backend,
            scheduler: None,
            grammars: std::sync::OnceLock::new(),
        }
    }

    /// The structured-output compiler (built once; its token trie covers the whole vocabulary).
    pub(crate) fn grammars(&self) -> Result<&structured::Grammars, ApiError> {
        self.grammars
            .get_or_init(|| structured::Grammars::new(&self.tokenizer))
            .as_ref()
            .map_err(|e| ApiError::internal(format!("structured output is unavailable: {e}")))
    }

    /// Tokenizer, chat template and sampling defaults from the GGUF the backend was loaded from.
    pub fn from_gguf(
        gguf: &crate::gguf::Gguf,
        backend: Arc<dyn Backend>,
    ) -> anyhow::Result<LoadedModel> {
        let tokenizer = Tokenizer::from_gguf(gguf)
            .map_err(|e| anyhow::anyhow!("cannot build the tokenizer: {e}"))?;
        let template = match ChatTemplate::from_gguf(gguf) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(
                    "no usable chat template ({e}); chat endpoints will refuse requests"
                );
                None
            }
        };
        let name = backend.info().name.clone();
        Ok(LoadedModel::new(
            name,
            backend,
            tokenizer,
            template,
            SamplingParams::model_defaults(gguf),
        ))
    }
}

enum ModelSlot {
    Loading,
    Ready(Arc<LoadedModel>),
    Failed(String),
}

struct Shared {
    config: ServerConfig,
    model: RwLock<ModelSlot>,
    metrics: Metrics,
    /// Recent `/v1/responses` conversations, for `previous_response_id`.
    responses: std::sync::Mutex<responses::ResponseStore>,
}

/// Cheap to clone; shared by every handler.
#[derive(Clone)]
pub struct AppState {
    shared: Arc<Shared>,
}

impl AppState {
    /// A server whose model is still loading (`/health` answers 503 until [`AppState::set_model`]).
    pub fn new(config: ServerConfig) -> AppState {
        AppState {
            shared: Arc::new(Shared {
                config,
                model: RwLock::new(ModelSlot::Loading),
                metrics: Metrics::default(),
                responses: Default::default(),
            }),
        }
    }

    /// Serve `model`: starts its scheduler with this server's `parallel` and queue settings.
    pub fn set_model(&self, mut model: LoadedModel) {
        let config = &self.shared.config;
        let parallel = match config.parallel {
            0 => model.default_parallel().max(1),
            n => n,
        };
        let scheduler_config = SchedulerConfig {
            parallel,
            queue: config.queue_capacity,
            cache_entries: crate::engine::cache::ENTRIES_PER_SLOT * parallel,
            cache_bytes: config.prompt_cache_bytes,
        };
        let stats = self.metrics().scheduler.clone();
        match Scheduler::start(model.backend.clone(), scheduler_config, stats) {
            Ok(scheduler) => {
                model.scheduler = Some(scheduler);
                self.set_slot(ModelSlot::Ready(Arc::new(model)));
            }
            Err(e) => self.set_load_error(format!("cannot start the scheduler thread: {e}")),
        }
    }

    pub fn set_load_error(&self, message: impl Into<String>) {
        self.set_slot(ModelSlot::Failed(message.into()));
    }

    fn set_slot(&self, slot: ModelSlot) {
        match self.shared.model.write() {
            Ok(mut guard) => *guard = slot,
            Err(poisoned) => *poisoned.into_inner() = slot,
        }
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    pub(crate) fn responses(&self) -> &std::sync::Mutex<responses::ResponseStore> {
        &self.shared.responses
    }

    /// The model, or 503 while loading / after a failed load.
    pub fn model(&self) -> Result<Arc<LoadedModel>, ApiError> {
        let guard = match self.shared.model.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        match &*guard {
            ModelSlot::Ready(m) => Ok(m.clone()),
            ModelSlot::Loading => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is still loading; retry when GET /health answers 200",
            )
            .with_code("model_loading")),
            ModelSlot::Failed(e) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the model failed to load: {e}"),
            )
            .with_code("model_load_failed")),
        }
    }
}

/// The router with every endpoint, auth, body limit and request metrics.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{model_id}", get(openai::model_by_id))
        // Without the /v1 prefix too: clients configured with a bare `http://host:port` base URL
        // (as llama.cpp's server allows) then work unchanged.
        .route("/chat/completions", post(openai::chat_completions))
        .route("/completions", post(openai::completions))
        .route("/models", get(openai::models))
        .route("/v1/responses", post(responses::responses))
        .route("/responses", post(responses::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/metrics", get(metrics_handler))
        .route("/v1/monitor", get(webui::monitor))
        .layer(axum::middleware::from_fn(require_json_content_type))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            record_request,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Outermost, so browser preflights (which carry no API key) are answered before auth, and
        // every answer, errors included, carries the CORS headers browser chat UIs need.
        .layer(CorsLayer::permissive())
        .with_state(state)
}

/// Whether a `Content-Type` value names JSON (`application/json`, `…+json`, any parameters).
fn is_json_content_type(value: &str) -> bool {
    let mime = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match mime.split_once('/') {
        Some((_, subtype)) => subtype == "json" || subtype.ends_with("+json"),
        None => false,
    }
}

/// Bodies are JSON: a request that declares another type (a form, plain text) gets 415 with a
/// hint, rather than having its bytes guessed at. A request without a Content-Type is read as
/// JSON, as the reference servers do.
async fn require_json_content_type(request: Request, next: Next) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let declared = request
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    match declared {
        Some(content_type) if !is_json_content_type(&content_type) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "the request body must be JSON sent with `Content-Type: application/json`, not {content_type:?} (with curl, add -H 'Content-Type: application/json')"
            ),
        )
        .with_flavor(flavor_for_path(request.uri().path()))
        .into_response(),
        _ => next.run(request).await,
    }
}

/// Serve on an already-bound listener until the process ends.
pub async fn serve_on(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

async fn health(State(state): State<AppState>) -> Response {
    match state.model() {
        Ok(m) => (
            StatusCode::OK,
            axum::Json(json!({
                "status": "ok",
                "model": m.name,
                "context_length": m.context_length,
                "api_key_required": state.shared.config.api_key.is_some(),
            })),
        )
            .into_response(),
        Err(e) => {
            let status = if e.code == Some("model_loading") {
                "loading"
            } else {
                "error"
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(json!({ "status": status, "message": e.message })),
            )
                .into_response()
        }
    }
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics().render(),
    )
        .into_response()
}

async fn not_found(request: Request) -> ApiError {
    let flavor = flavor_for_path(request.uri().path());
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {}", request.method(), request.uri().path()),
    )
    .with_flavor(flavor)
}

async fn method_not_allowed(request: Request) -> ApiError {
    let path = request.uri().path();
    let expected = if ["/health", "/metrics", "/models", "/v1/monitor"].contains(&path)
        || path.starts_with("/v1/models")
    {
        "GET"
    } else {
        "POST"
    };
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not allowed on {path}; use {expected}",
            request.method()
        ),
    )
    .with_flavor(flavor_for_path(path))
}

fn flavor_for_path(path: &str) -> Flavor {
    if path.starts_with("/v1/messages") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

/// Byte-wise comparison whose time does not depend on where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer TOKEN` header; the scheme name is case-insensitive
/// (RFC 9110), and some clients send `bearer`.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

async fn require_api_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(expected) = state.shared.config.api_key.as_deref() else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let ok = [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|given| constant_time_eq(given.trim().as_bytes(), expected.as_bytes()));
    if ok {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
    )
    .with_code("invalid_api_key")
    .with_flavor(flavor_for_path(request.uri().path()))
    .into_response()
}

async fn record_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let path = request.uri().path().to_string();
    let path = match path.as_str() {
        "/chat/completions" | "/completions" | "/models" | "/responses" => format!("/v1{path}"),
        _ => path,
    };
    let endpoint = match path.as_str() {
        "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/responses"
        | "/v1/models"
        | "/v1/messages"
        | "/v1/messages/count_tokens"
        | "/health"
        | "/metrics"
        | "/v1/monitor" => path,
        _ => "other".to_string(),
    };
    let method = request.method().clone();
    let response = next.run(request).await;
    let seconds = start.elapsed().as_secs_f64();
    let status = response.status().as_u16();
    state.metrics().record_request(&endpoint, status, seconds);
    // For a stream this is the time to the response head; the generation logs its own line.
    tracing::info!(
        "{method} {endpoint} -> {status} in {:.1} ms",
        seconds * 1000.0
    );
    response
}

/// Parse a JSON body, turning every failure (unreadable, too large, malformed, wrong types) into
/// an error in the route's format.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    flavor: Flavor,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "request body is larger than the {} MiB limit",
                MAX_BODY_BYTES / (1024 * 1024)
            )
        } else {
            format!("cannot read the request body: {rejection}")
        };
        ApiError::new(status, message).with_flavor(flavor)
    })?;
    if bytes.is_empty() {
        return Err(
            ApiError::bad_request("the request body is empty; expected a JSON object")
                .with_flavor(flavor),
        );
    }
    // Parse in two steps: syntax first (errors with line and column), then the shape, so a body
    // that is valid JSON but not an object is told so instead of getting a field-level riddle.
    // Windows tools (PowerShell, some .NET clients) prefix a UTF-8 byte-order mark, which JSON
    // forbids but which carries no meaning: skip it rather than fail at "line 1 column 1".
    let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let json: serde_json::Value = serde_json::from_slice(text).map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            .with_flavor(flavor)
    })?;
    if !json.is_object() {
        return Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            json_kind(&json)
        ))
        .with_flavor(flavor));
    }
    let value: T = serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        let message = plain_type_names(&e.into_inner().to_string());
        // The path is "." when the problem is at the top level (e.g. a missing field).
        if path == "." {
            ApiError::bad_request(format!("invalid request: {message}"))
        } else {
            ApiError::invalid_param(&path, format!("invalid value for `{path}`: {message}"))
        }
        .with_flavor(flavor)
    })?;
    Ok(value)
}

/// "an array", "a string", … for error messages.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// serde names Rust types ("expected i64"); clients know JSON ones.
fn plain_type_names(message: &str) -> String {
    [
        ("expected i64", "expected a signed 64-bit integer"),
        ("expected u64", "expected a non-negative 64-bit integer"),
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
    ]
    .iter()
    .fold(message.to_string(), |m, (from, to)| m.replace(from, to))
}

// ---------------------------------------------------------------------------------------------
// Running a generation on the blocking pool.

/// What a handler hands to the scheduler.
pub(crate) struct Job {
    pub request: GenerateRequest,
    pub options: GenerationOptions,
}

pub(crate) enum JobEvent {
    /// Prompt processing: `done` of `total` tokens, `cached` of them from the prompt cache.
    Progress {
        done: usize,
        total: usize,
        cached: usize,
        time_ms: u64,
    },
    /// Log-probabilities of the next token (sent before its text).
    Logprobs(TokenLogprobs),
    /// Text as it is generated.
    Text(String),
    Done(Result<GenOutput, ApiError>),
}

/// Raises the cancel flag when dropped (the response went away).
pub(crate) struct CancelOnDrop(pub Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

pub(crate) struct JobHandle {
    pub events: mpsc::UnboundedReceiver<JobEvent>,
    /// Keep alive as long as the client is listening.
    pub _cancel: CancelOnDrop,
}

/// Queue a job with the scheduler (503 when the wait queue is full).
pub(crate) fn start_job(
    state: &AppState,
    model: Arc<LoadedModel>,
    job: Job,
    flavor: Flavor,
) -> Result<JobHandle, ApiError> {
    let scheduler = model
        .scheduler
        .as_ref()
        .ok_or_else(|| ApiError::internal("the model has no scheduler").with_flavor(flavor))?;
    let cancel = Arc::new(AtomicBool::new(false));
    let (sender, events) = mpsc::unbounded_channel();
    let submission = Submission {
        request: job.request,
        options: job.options,
        decoder: Box::new(crate::tokenizer::StreamDecoder::new(&model.tokenizer)),
        cancel: cancel.clone(),
        on_event: event_sink(state.clone(), sender.clone(), cancel.clone()),
        on_done: Box::new(done_sink(state.clone(), sender, flavor)),
    };
    scheduler.submit(submission).map_err(|e| {
        let error = match e {
            SubmitError::QueueFull { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("{e}; retry later"))
                    .with_code("queue_full")
            }
            SubmitError::Stopped => ApiError::internal(e.to_string()),
        };
        error.with_flavor(flavor)
    })?;
    Ok(JobHandle {
        events,
        _cancel: CancelOnDrop(cancel),
    })
}

/// Forwards a generation's events to the handler; a closed channel (the response is gone)
/// raises the cancel flag, so the generation stops at its next step.
fn event_sink(
    state: AppState,
    sender: mpsc::UnboundedSender<JobEvent>,
    cancel: Arc<AtomicBool>,
) -> Box<dyn FnMut(GenEvent) + Send> {
    let started = Instant::now();
    let mut cached = None;
    Box::new(move |event: GenEvent| {
        let sent = match event {
            GenEvent::Token { text, logprobs, .. } => {
                state
                    .metrics()
                    .generated_tokens
                    .fetch_add(1, Ordering::Relaxed);
                let lp_ok = logprobs.is_none_or(|lp| sender.send(JobEvent::Logprobs(lp)).is_ok());
                lp_ok && (text.is_empty() || sender.send(JobEvent::Text(text)).is_ok())
            }
            GenEvent::TrailingText(text) => sender.send(JobEvent::Text(text)).is_ok(),
            GenEvent::PromptProgress { done, total } => {
                let cached = *cached.get_or_insert(done);
                sender
                    .send(JobEvent::Progress {
                        done,
                        total,
                        cached,
                        time_ms: started.elapsed().as_millis() as u64,
                    })
                    .is_ok()
            }
        };
        if !sent {
            cancel.store(true, Ordering::Relaxed);
        }
    })
}

/// Records a finished generation in the metrics and the log, and hands the result over.
fn done_sink(
    state: AppState,
    sender: mpsc::UnboundedSender<JobEvent>,
    flavor: Flavor,
) -> impl FnOnce(Result<GenOutput, GenerateError>) + Send + 'static {
    move |result| {
        let metrics = state.metrics();
        let result = match result {
            Ok(output) => {
                record_output(metrics, &output);
                Ok(output)
            }
            Err(e) => {
                if matches!(e, GenerateError::Cancelled) {
                    metrics
                        .cancelled_generations
                        .fetch_add(1, Ordering::Relaxed);
                } else {
                    tracing::warn!("generation failed: {e}");
                }
                Err(generate_error_to_api(e).with_flavor(flavor))
            }
        };
        let _ = sender.send(JobEvent::Done(result));
    }
}

fn record_output(metrics: &Metrics, output: &GenOutput) {
    metrics
        .prompt_tokens
        .fetch_add(output.usage.prompt_tokens as u64, Ordering::Relaxed);
    metrics
        .cached_prompt_tokens
        .fetch_add(output.usage.cached_tokens as u64, Ordering::Relaxed);
    metrics.record_speeds(
        output.prefill_tokens_per_second(),
        output.decode_tokens_per_second(),
    );
    if output.finish == crate::engine::generate::FinishReason::Cancelled {
        metrics
            .cancelled_generations
            .fetch_add(1, Ordering::Relaxed);
    }
    tracing::info!(
        "generation: prompt {} tokens ({} cached) at {:.1} tok/s, {} tokens at {:.1} tok/s, seed {}, ended by {:?}",
        output.usage.prompt_tokens,
        output.usage.cached_tokens,
        output.prefill_tokens_per_second(),
        output.usage.completion_tokens,
        output.decode_tokens_per_second(),
        output.seed,
        output.finish
    );
}

pub(crate) fn generate_error_to_api(e: GenerateError) -> ApiError {
    match e {
        GenerateError::EmptyPrompt | GenerateError::Cancelled => {
            ApiError::bad_request(e.to_string())
        }
        GenerateError::ZeroMaxTokens => ApiError::invalid_param("max_tokens", e.to_string()),
        GenerateError::ContextOverflow { .. } => {
            ApiError::bad_request(e.to_string()).with_code("context_length_exceeded")
        }
        GenerateError::Sampler(crate::sampler::SamplerError::InvalidParam(m)) => {
            ApiError::bad_request(m)
        }
        GenerateError::Sampler(_) | GenerateError::Engine(_) => {
            ApiError::internal(e.to_string()).with_code("engine_error")
        }
    }
}

/// Check the prompt against the context before queueing (400 with the token counts).
pub(crate) fn check_context(
    model: &LoadedModel,
    prompt_tokens: usize,
    max_tokens: usize,
    flavor: Flavor,
) -> Result<(), ApiError> {
    let ctx = model.context_length;
    if prompt_tokens >= ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {prompt_tokens} tokens, which does not fit the model's context of {ctx} tokens"
        ))
        .with_code("context_length_exceeded")
        .with_flavor(flavor));
    }
    if prompt_tokens.saturating_add(max_tokens) > ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {prompt_tokens} tokens and max_tokens is {max_tokens}: {} > the model's context of {ctx} tokens; lower max_tokens to at most {}",
            prompt_tokens.saturating_add(max_tokens),
            ctx - prompt_tokens
        ))
        .with_code("context_length_exceeded")
        .with_flavor(flavor));
    }
    Ok(())
}

/// Headers every generation response carries: the seed actually used, so output can be replayed.
pub(crate) fn seed_headers(seed: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Ok(v) = seed.to_string().parse() {
        headers.insert("x-strata-seed", v);
    }
    headers
}

/// A short random id for responses (`chatcmpl-…`, `msg_…`, `call_…`).
pub(crate) fn random_id(prefix: &str) -> String {
    format!("{prefix}{:016x}", crate::sampler::random_seed())
}

pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
