//! The built-in web page (chat and monitor) and its JSON feed, `GET /v1/monitor`.
//!
//! The page's files are compiled into the binary (`include_str!`), so it works offline and from an
//! installed binary with no files beside it. The assets are public; every API call the page makes
//! still needs the API key when one is set (`/v1/monitor` sits behind the same check as the rest).

use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::{AppState, LoadedModel, router};

/// One embedded file: its URL path, content type and text.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX_HTML: &str = include_str!("../../web/index.html");

const ASSETS: [Asset; 6] = [
    Asset {
        path: "/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../../web/style.css"),
    },
    Asset {
        path: "/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../web/app.js"),
    },
    Asset {
        path: "/chat.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../web/chat.js"),
    },
    Asset {
        path: "/markdown.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../web/markdown.js"),
    },
    Asset {
        path: "/chart.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../web/chart.js"),
    },
    Asset {
        path: "/monitor.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../web/monitor.js"),
    },
];

/// What the page is told at start-up (as attributes of its `<body>`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WebUi {
    /// No `--model` was given: the page explains how to point strata at a GGUF.
    pub demo_model: bool,
}

/// The routes serving the page's files (no state, no auth).
fn page_routes(options: WebUi) -> Router {
    let index = INDEX_HTML.replacen(
        "<body>",
        &format!("<body data-demo=\"{}\">", options.demo_model),
        1,
    );
    let index_route = get(move || async move {
        (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            index,
        )
    });
    ASSETS
        .iter()
        .fold(Router::new().route("/", index_route), |r, asset| {
            let (content_type, body) = (asset.content_type, asset.body);
            r.route(
                asset.path,
                get(move || async move {
                    (
                        [
                            (header::CONTENT_TYPE, content_type),
                            (header::CACHE_CONTROL, "no-cache"),
                        ],
                        body,
                    )
                }),
            )
        })
}

/// The server's full router: every API route, plus the web page unless `web_ui` is `None`
/// (`strata serve --no-webui`), in which case `/` stays a JSON 404.
pub fn app(state: AppState, web_ui: Option<WebUi>) -> Router {
    let api = router(state);
    match web_ui {
        Some(options) => page_routes(options).merge(api),
        None => api,
    }
}

/// [`app`] served on an already-bound listener until the process ends.
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    state: AppState,
    web_ui: Option<WebUi>,
) -> std::io::Result<()> {
    axum::serve(listener, app(state, web_ui)).await
}

/// `GET /v1/monitor`: what the server knows now, as JSON. Fields the backend does not report are
/// `null` (the page shows "n/a").
pub async fn monitor(State(state): State<AppState>) -> Response {
    let (status, message, model) = match state.model() {
        Ok(m) => ("ready", None, Some(m)),
        Err(e) if e.code == Some("model_loading") => ("loading", None, None),
        Err(e) => ("failed", Some(e.message), None),
    };
    axum::Json(json!({
        "status": status,
        "message": message,
        "api_key_required": state.shared.config.api_key.is_some(),
        "model": model.as_deref().map(model_json),
        "defaults": model.as_deref().map(defaults_json),
        "throughput": throughput_json(&state),
        "queue": queue_json(&state),
        // The VRAM plan, expert-slot cache and PLE reader live inside the GPU backend, which the
        // server sees only through `engine::Backend`: not reported yet.
        "memory": Value::Null,
        "expert_cache": Value::Null,
        "ple": Value::Null,
        "time_ms": unix_time_ms(),
    }))
    .into_response()
}

fn model_json(m: &LoadedModel) -> Value {
    json!({
        "name": m.name,
        "backend": m.backend_name,
        "context_length": m.context_length,
        "vocab_size": m.vocab_size,
        "chat_template": m.template.is_some(),
    })
}

fn defaults_json(m: &LoadedModel) -> Value {
    let d = &m.defaults;
    json!({
        "temperature": d.temperature,
        "top_p": d.top_p,
        "top_k": d.top_k,
        "min_p": d.min_p,
        "presence_penalty": d.presence_penalty,
        "frequency_penalty": d.frequency_penalty,
        "repetition_penalty": d.repetition_penalty,
    })
}

fn throughput_json(state: &AppState) -> Value {
    let m = state.metrics();
    json!({
        "prefill_tokens_per_second_last": m.last_prefill_tps(),
        "decode_tokens_per_second_last": m.last_decode_tps(),
        "prompt_tokens_total": m.prompt_tokens.load(Ordering::Relaxed),
        "cached_prompt_tokens_total": m.cached_prompt_tokens.load(Ordering::Relaxed),
        "generated_tokens_total": m.generated_tokens.load(Ordering::Relaxed),
        "cancelled_generations_total": m.cancelled_generations.load(Ordering::Relaxed),
    })
}

fn queue_json(state: &AppState) -> Value {
    let m = state.metrics();
    json!({
        "waiting": m.scheduler.waiting.load(Ordering::Relaxed),
        "running": m.scheduler.running.load(Ordering::Relaxed),
        "capacity": state.shared.config.queue_capacity,
    })
}

fn unix_time_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
