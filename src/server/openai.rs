//! OpenAI-compatible endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::prompt::{self, ChatPrompt, PreparedPrompt, ToolChoice};
use super::{
    ApiError, AppState, Flavor, Job, JobEvent, JobHandle, LoadedModel, check_context, parse_body,
    random_id, seed_headers, start_job, unix_time,
};
use super::{logprobs, structured};
use crate::chat::toolcall::{ParsedOutput, StreamEvent, StreamParser, ToolSpec};
use crate::chat::{Message, ToolCall};
use crate::engine::generate::{FinishReason, GenOutput, GenerateRequest, Usage};
use crate::engine::generation::GenerationOptions;
use crate::sampler::SamplingParams;
use crate::sampler::logprobs::TokenLogprobs;

const FLAVOR: Flavor = Flavor::OpenAi;

/// Most `logprobs` a completions request may ask for (OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: i64 = 5;

/// Sampling fields shared by both OpenAI endpoints (kept in each request struct rather than
/// `#[serde(flatten)]`ed, so a bad value's error names its field).
#[derive(Debug, Default)]
pub struct SamplingFields {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
}

/// A request's `seed`: any JSON integer from -2^63 to 2^64-1. Responses report the seed as an
/// unsigned 64-bit number, so replaying a reported seed must be accepted; negative seeds are
/// taken as their two's-complement bits (as the signed spelling of the same 64 bits).
pub fn deserialize_seed<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum AnySeed {
        Unsigned(u64),
        Signed(i64),
    }
    let seed: Option<AnySeed> = Option::deserialize(deserializer).map_err(|_| {
        serde::de::Error::custom("seed must be an integer between -2^63 and 2^64-1")
    })?;
    Ok(seed.map(|s| match s {
        AnySeed::Unsigned(u) => u,
        AnySeed::Signed(i) => i as u64,
    }))
}

macro_rules! sampling_fields {
    ($req:expr) => {
        SamplingFields {
            temperature: $req.temperature,
            top_p: $req.top_p,
            top_k: $req.top_k,
            min_p: $req.min_p,
            presence_penalty: $req.presence_penalty,
            frequency_penalty: $req.frequency_penalty,
            repetition_penalty: $req.repetition_penalty,
            seed: $req.seed,
        }
    };
}

impl SamplingFields {
    /// The model's defaults with the request's fields on top, validated.
    pub fn resolve(
        &self,
        defaults: &SamplingParams,
        flavor: Flavor,
    ) -> Result<SamplingParams, ApiError> {
        let mut p = defaults.clone();
        if let Some(v) = self.temperature {
            p.temperature = v;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(v) = self.top_k {
            // -1 is a common spelling of "no top-k".
            p.top_k = if v < 0 { 0 } else { v as usize };
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = v;
        }
        if let Some(v) = self.repetition_penalty {
            p.repetition_penalty = v;
        }
        p.seed = Some(match self.seed {
            Some(s) => s,
            None => defaults.seed.unwrap_or_else(crate::sampler::random_seed),
        });
        p.validate().map_err(|e| {
            let error = ApiError::bad_request(e.to_string()).with_flavor(flavor);
            // The sampler's messages start with the parameter's name: point `param` at it.
            match &e {
                crate::sampler::SamplerError::InvalidParam(message) => {
                    match message.split_whitespace().next() {
                        Some(name) => error.with_param(name),
                        None => error,
                    }
                }
                _ => error,
            }
        })?;
        Ok(p)
    }
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<Value>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// Responses-API style `{"effort": ..}`, accepted here too.
    #[serde(default)]
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    pub stop: Option<Value>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default, deserialize_with = "deserialize_seed")]
    pub seed: Option<u64>,
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Extension: a Lark grammar the output must match.
    #[serde(default)]
    pub grammar: Option<Value>,
    /// Extension: a regular expression the output must match.
    #[serde(default)]
    pub regex: Option<Value>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
}

/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// `logprobs` / `top_logprobs` (chat): `Some(n)` when log-probabilities are wanted.
fn chat_logprobs(logprobs: Option<bool>, top: Option<i64>) -> Result<Option<usize>, ApiError> {
    let top = match top {
        None => 0,
        Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
            ));
        }
    };
    match logprobs {
        Some(true) => Ok(Some(top)),
        _ if top > 0 => Err(ApiError::invalid_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        _ => Ok(None),
    }
}

/// The one output constraint of a request: `response_format`, or the `grammar` / `regex`
/// extensions. Compiled here, so an unenforceable schema is a 400 before any compute.
pub(crate) fn output_constraint(
    model: &LoadedModel,
    response_format: Option<&Value>,
    grammar: Option<&Value>,
    regex: Option<&Value>,
) -> Result<Option<Box<dyn crate::engine::generation::TokenConstraint>>, ApiError> {
    let format =
        structured::parse_response_format(response_format)?.map(|f| (f, "response_format"));
    let extension = structured::parse_extensions(grammar, regex)?;
    let (format, param) = match (format, extension) {
        (Some(_), Some((_, name))) => {
            return Err(ApiError::invalid_param(
                name,
                format!("give either response_format or {name}, not both"),
            ));
        }
        (Some(f), None) | (None, Some(f)) => f,
        (None, None) => return Ok(None),
    };
    Ok(Some(model.grammars()?.constraint(&format, param)?))
}

/// `stop`: a string or an array of strings.
pub fn parse_stop(
    stop: Option<&Value>,
    param: &str,
    flavor: Flavor,
) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            param,
            format!("{param} must be a string or an array of strings"),
        )
        .with_flavor(flavor)
    };
    match stop {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => {
            if items.len() > 16 {
                return Err(ApiError::invalid_param(
                    param,
                    format!("{param} has more than 16 entries"),
                )
                .with_flavor(flavor));
            }
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
                .collect()
        }
        Some(_) => Err(bad()),
    }
}

/// `max_tokens` must be ≥ 1 when given; absent means "the rest of the context".
pub fn resolve_max_tokens(
    value: Option<i64>,
    param: &str,
    model: &LoadedModel,
    prompt_tokens: usize,
    flavor: Flavor,
) -> Result<usize, ApiError> {
    match value {
        Some(v) if v <= 0 => Err(ApiError::invalid_param(
            param,
            format!("{param} must be at least 1, got {v}"),
        )
        .with_flavor(flavor)),
        Some(v) => Ok(usize::try_from(v).unwrap_or(usize::MAX)),
        None => Ok(model.context_length.saturating_sub(prompt_tokens).max(1)),
    }
}

/// Text of a message's `content`: a string, null, or an array of `{"type":"text","text":..}`.
fn content_text(content: Option<&Value>, where_: &str) -> Result<Option<String>, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "text" | "input_text" | "output_text" => {
                        let t = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::invalid_param(
                                where_,
                                format!("{where_}[{i}] is a text part without a \"text\" string"),
                            )
                        })?;
                        text.push_str(t);
                    }
                    "image_url" | "input_image" | "image" => {
                        return Err(ApiError::invalid_param(
                            where_,
                            "image input is not supported by this server",
                        ));
                    }
                    other => {
                        return Err(ApiError::invalid_param(
                            where_,
                            format!("{where_}[{i}] has unsupported content type {other:?}"),
                        ));
                    }
                }
            }
            Ok(Some(text))
        }
        Some(_) => Err(ApiError::invalid_param(
            where_,
            format!("{where_} must be a string or an array of content parts"),
        )),
    }
}

/// OpenAI messages → template messages.
pub fn convert_messages(messages: &[Value]) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must contain at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        // Some clients double-encode a message as a JSON string.
        let decoded;
        let m = match m {
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => {
                    decoded = v;
                    &decoded
                }
                _ => {
                    return Err(ApiError::invalid_param(
                        &format!("messages[{i}]"),
                        format!("messages[{i}] must be an object"),
                    ));
                }
            },
            Value::Object(_) => m,
            _ => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}]"),
                    format!("messages[{i}] must be an object"),
                ));
            }
        };
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid_param(
                &format!("messages[{i}].role"),
                format!("messages[{i}] has no \"role\" string"),
            )
        })?;
        let role = match role {
            "system" | "developer" => "system",
            "user" | "assistant" | "tool" => role,
            other => {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].role"),
                    format!(
                        "messages[{i}] has unknown role {other:?}; expected system, developer, user, assistant or tool"
                    ),
                ));
            }
        };
        let mut content = content_text(m.get("content"), &format!("messages[{i}].content"))?;
        // Only an assistant turn may lack content (it can be all tool calls).
        if role != "assistant" && content.is_none() {
            content = Some(String::new());
        }
        let reasoning_content = m
            .get("reasoning_content")
            .or_else(|| m.get("reasoning"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut tool_calls = Vec::new();
        if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
            let calls = calls.as_array().ok_or_else(|| {
                ApiError::invalid_param(
                    &format!("messages[{i}].tool_calls"),
                    format!("messages[{i}].tool_calls must be an array"),
                )
            })?;
            for (j, call) in calls.iter().enumerate() {
                let param = format!("messages[{i}].tool_calls[{j}]");
                let function = call.get("function").unwrap_or(call);
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid_param(&param, format!("{param} has no function name"))
                    })?;
                let arguments =
                    prompt::arguments_to_object(function.get("arguments").unwrap_or(&Value::Null))
                        .map_err(|e| {
                            ApiError::invalid_param(
                                &format!("{param}.function.arguments"),
                                format!("{param}.function.arguments: {e}"),
                            )
                        })?;
                tool_calls.push(ToolCall {
                    id: call
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    name: name.to_string(),
                    arguments,
                });
            }
        }
        out.push(Message {
            role: role.to_string(),
            content,
            reasoning_content,
            tool_calls,
            tool_call_id: m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(str::to_string),
            name: m.get("name").and_then(Value::as_str).map(str::to_string),
        });
    }
    Ok(prompt::normalise_roles(out))
}

fn parse_tool_choice(value: Option<&Value>) -> Result<Option<ToolChoice>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\":\"function\",\"function\":{\"name\":..}}",
        )
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" | "any" => Ok(Some(ToolChoice::Required)),
            _ => Err(bad()),
        },
        Some(obj @ Value::Object(_)) => {
            let name = obj
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| obj.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            Ok(Some(ToolChoice::Named(name.to_string())))
        }
        Some(_) => Err(bad()),
    }
}

/// Everything the chat handler derives from a request before queueing it.
pub struct PreparedChat {
    pub prepared: PreparedPrompt,
    pub job: GenerateRequest,
    pub options: GenerationOptions,
    pub stream: bool,
    pub include_usage: bool,
    pub parallel_tool_calls: bool,
}

pub fn prepare_chat_request(
    model: &LoadedModel,
    req: ChatCompletionRequest,
) -> Result<PreparedChat, ApiError> {
    if let Some(n) = req.n
        && n != 1
    {
        return Err(ApiError::invalid_param(
            "n",
            format!("n = {n} is not supported: this server returns exactly one choice"),
        ));
    }
    let messages = convert_messages(&req.messages)?;
    let mut chat = ChatPrompt {
        messages,
        tools: req.tools.unwrap_or_default(),
        tool_choice: parse_tool_choice(req.tool_choice.as_ref())?,
        ..ChatPrompt::default()
    };
    let effort = req.reasoning_effort.clone().or_else(|| {
        req.reasoning
            .as_ref()
            .and_then(|r| r.get("effort"))
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    if let Some(effort) = effort {
        let (thinking, effort) = prompt::map_reasoning_effort(&effort)
            .map_err(|e| ApiError::invalid_param("reasoning_effort", e))?;
        chat.enable_thinking = thinking;
        chat.reasoning_effort = effort;
    }
    if let Some(mut kwargs) = req.chat_template_kwargs {
        if let Some(v) = kwargs.remove("enable_thinking") {
            chat.enable_thinking = Some(v.as_bool().ok_or_else(|| {
                ApiError::invalid_param(
                    "chat_template_kwargs.enable_thinking",
                    "chat_template_kwargs.enable_thinking must be a boolean",
                )
            })?);
        }
        if let Some(v) = kwargs.remove("reasoning_effort") {
            let effort = v.as_str().ok_or_else(|| {
                ApiError::invalid_param(
                    "chat_template_kwargs.reasoning_effort",
                    "chat_template_kwargs.reasoning_effort must be a string",
                )
            })?;
            let (thinking, effort) = prompt::map_reasoning_effort(effort)
                .map_err(|e| ApiError::invalid_param("chat_template_kwargs.reasoning_effort", e))?;
            chat.enable_thinking = chat.enable_thinking.or(thinking);
            chat.reasoning_effort = effort;
        }
        chat.extra = kwargs;
    }
    let sampling = sampling_fields!(req).resolve(&model.defaults, FLAVOR)?;
    let stop_strings = parse_stop(req.stop.as_ref(), "stop", FLAVOR)?;
    let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
    let mut constraint = output_constraint(
        model,
        req.response_format.as_ref(),
        req.grammar.as_ref(),
        req.regex.as_ref(),
    )?;
    if constraint.is_none()
        && let Some(ToolChoice::Named(name)) = &chat.tool_choice
        && let Some(format) = structured::forced_tool(&chat.tools, name)
    {
        // A named tool_choice is enforced: the output is that call, arguments per its schema.
        constraint = Some(model.grammars()?.constraint(&format, "tool_choice")?);
    }
    if constraint.is_some() {
        // The constraint covers the whole output: no free-form thinking before it.
        chat.enable_thinking = Some(false);
    }
    let prepared = prompt::prepare_chat(model, chat, FLAVOR)?;
    if constraint.is_some() && prepared.starts_in_reasoning {
        return Err(ApiError::invalid_param(
            "response_format",
            "this model's chat template always starts with thinking, which structured output cannot constrain",
        ));
    }
    let (param, value) = match req.max_completion_tokens {
        Some(v) => ("max_completion_tokens", Some(v)),
        None => ("max_tokens", req.max_tokens),
    };
    let max_tokens = resolve_max_tokens(value, param, model, prepared.ids.len(), FLAVOR)?;
    check_context(model, prepared.ids.len(), max_tokens, FLAVOR)?;
    let job = GenerateRequest {
        prompt: prepared.ids.clone(),
        max_tokens,
        sampling,
        stop_ids: model.tokenizer.stop_ids(),
        stop_strings,
        checkpoint: prepared.checkpoint,
    };
    Ok(PreparedChat {
        prepared,
        job,
        options: GenerationOptions {
            logprobs,
            constraint,
        },
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.map(|o| o.include_usage).unwrap_or(false),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
    })
}

pub async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(body, FLAVOR)?;
    let model = state.model()?;
    let chat = prepare_chat_request(&model, req)?;
    let seed = chat.job.sampling.seed.unwrap_or_default();
    let assembler = ChatAssembler::new(
        &model.name,
        chat.prepared.starts_in_reasoning,
        chat.prepared.tool_specs.clone(),
        chat.parallel_tool_calls,
        chat.prepared.tool_call_required,
    );
    let wants_logprobs = chat.options.logprobs.is_some();
    let job = Job {
        request: chat.job,
        options: chat.options,
    };
    let handle = start_job(&state, model.clone(), job, FLAVOR)?;
    if chat.stream {
        let stream = ChatStreamer {
            assembler,
            include_usage: chat.include_usage,
            seed,
            tokenizer: model.tokenizer.clone(),
            pending_logprobs: Vec::new(),
        };
        return Ok((seed_headers(seed), sse_response(handle, stream)).into_response());
    }
    let (text, output) = collect(handle).await?;
    let mut assembler = assembler;
    assembler.push_text(&text);
    let mut body = assembler.into_response(&output);
    if wants_logprobs {
        body["choices"][0]["logprobs"] =
            logprobs::chat_logprobs(&model.tokenizer, &output.logprobs);
    }
    Ok((seed_headers(seed), axum::Json(body)).into_response())
}

/// Wait for a job and return its text and output (non-streaming responses).
pub(crate) async fn collect(mut handle: JobHandle) -> Result<(String, GenOutput), ApiError> {
    let mut text = String::new();
    while let Some(event) = handle.events.recv().await {
        match event {
            JobEvent::Text(t) => text.push_str(&t),
            JobEvent::Done(result) => return result.map(|o| (text, o)),
            JobEvent::Progress { .. } | JobEvent::Logprobs(_) => {}
        }
    }
    Err(ApiError::internal(
        "the generation thread ended without a result",
    ))
}

/// Turns a job's events into SSE events.
pub(crate) trait SseAssembler: Send + 'static {
    fn start(&mut self) -> Vec<Event>;
    fn text(&mut self, text: &str) -> Vec<Event>;
    /// Prompt processing progress (sent before the first token and after each prompt chunk).
    fn progress(&mut self, _progress: &Progress) -> Vec<Event> {
        Vec::new()
    }
    /// Log-probabilities of the token whose text comes next.
    fn logprobs(&mut self, _logprobs: TokenLogprobs) {}
    /// The last events; the stream ends after them.
    fn done(&mut self, result: Result<GenOutput, ApiError>) -> Vec<Event>;
}

/// Prompt processing progress, as llama.cpp's server reports it (`prompt_progress`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    pub done: usize,
    pub total: usize,
    pub cached: usize,
    pub time_ms: u64,
}

impl Progress {
    pub fn json(&self) -> Value {
        json!({
            "total": self.total,
            "cache": self.cached,
            "processed": self.done,
            "time_ms": self.time_ms,
        })
    }
}

/// An SSE response fed by a job. Dropping the response (client gone) drops the job handle, which
/// raises the cancel flag.
pub(crate) fn sse_response<A: SseAssembler>(handle: JobHandle, mut assembler: A) -> Response {
    let first = assembler.start();
    let state = (handle, assembler, false);
    let rest = futures::stream::unfold(state, |(mut handle, mut assembler, finished)| async move {
        if finished {
            return None;
        }
        match handle.events.recv().await {
            Some(JobEvent::Text(t)) => {
                let events = assembler.text(&t);
                Some((events, (handle, assembler, false)))
            }
            Some(JobEvent::Progress {
                done,
                total,
                cached,
                time_ms,
            }) => {
                let progress = Progress {
                    done,
                    total,
                    cached,
                    time_ms,
                };
                let events = assembler.progress(&progress);
                Some((events, (handle, assembler, false)))
            }
            Some(JobEvent::Logprobs(lp)) => {
                assembler.logprobs(lp);
                Some((Vec::new(), (handle, assembler, false)))
            }
            Some(JobEvent::Done(result)) => {
                let events = assembler.done(result);
                Some((events, (handle, assembler, true)))
            }
            None => {
                let events = assembler.done(Err(ApiError::internal(
                    "the generation thread ended without a result",
                )));
                Some((events, (handle, assembler, true)))
            }
        }
    });
    let stream = futures::stream::iter(vec![first])
        .chain(rest)
        .flat_map(futures::stream::iter)
        .map(Ok::<Event, Infallible>);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    response.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    response
}

fn finish_reason(finish: &FinishReason, has_tool_calls: bool) -> &'static str {
    match finish {
        FinishReason::Length => "length",
        _ if has_tool_calls => "tool_calls",
        _ => "stop",
    }
}

pub fn usage_json(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": usage.cached_tokens },
    })
}

/// Model text → OpenAI chat response pieces. Used for streaming (chunk by chunk) and for the
/// non-streaming response (all text pushed, then [`ChatAssembler::into_response`]).
pub struct ChatAssembler {
    id: String,
    created: u64,
    model: String,
    parser: Option<StreamParser>,
    /// `call_…` id per tool-call index.
    tool_ids: Vec<String>,
    parallel_tool_calls: bool,
    tool_call_required: bool,
}

impl ChatAssembler {
    pub fn new(
        model: &str,
        starts_in_reasoning: bool,
        tools: Vec<ToolSpec>,
        parallel_tool_calls: bool,
        tool_call_required: bool,
    ) -> ChatAssembler {
        ChatAssembler {
            id: random_id("chatcmpl-"),
            created: unix_time(),
            model: model.to_string(),
            parser: Some(StreamParser::new(starts_in_reasoning, tools)),
            tool_ids: Vec::new(),
            parallel_tool_calls,
            tool_call_required,
        }
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason }],
        })
    }

    /// The opening chunk (role).
    pub fn first_chunk(&self) -> Value {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    fn tool_id(&mut self, index: usize) -> String {
        while self.tool_ids.len() <= index {
            self.tool_ids.push(random_id("call_"));
        }
        self.tool_ids[index].clone()
    }

    fn keep(&self, index: usize) -> bool {
        self.parallel_tool_calls || index == 0
    }

    fn event_chunks(&mut self, events: Vec<StreamEvent>) -> Vec<Value> {
        let mut out = Vec::new();
        for event in events {
            let delta = match event {
                StreamEvent::Reasoning(t) => json!({ "reasoning_content": t }),
                StreamEvent::Content(t) => json!({ "content": t }),
                StreamEvent::ToolCallStart { index, name } => {
                    if !self.keep(index) {
                        continue;
                    }
                    let id = self.tool_id(index);
                    json!({ "tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": { "name": name, "arguments": "" },
                    }]})
                }
                StreamEvent::ToolCallArguments {
                    index,
                    json_fragment,
                } => {
                    if !self.keep(index) {
                        continue;
                    }
                    json!({ "tool_calls": [{ "index": index, "function": { "arguments": json_fragment } }] })
                }
                StreamEvent::ToolCallEnd { .. } => continue,
            };
            out.push(self.chunk(delta, None));
        }
        out
    }

    /// Chunks for a piece of model text.
    pub fn push_text(&mut self, text: &str) -> Vec<Value> {
        let events = match self.parser.as_mut() {
            Some(p) => p.push(text),
            None => Vec::new(),
        };
        self.event_chunks(events)
    }

    /// Final chunks: what the parser still held, then the one with `finish_reason`; and the
    /// parsed output (with only the kept tool calls).
    pub fn finish_chunks(&mut self, finish: &FinishReason) -> (Vec<Value>, ParsedOutput) {
        let (events, mut parsed) = match self.parser.take() {
            Some(p) => p.finish(*finish == FinishReason::Length),
            None => (Vec::new(), ParsedOutput::default()),
        };
        let mut chunks = self.event_chunks(events);
        if !self.parallel_tool_calls {
            parsed.tool_calls.truncate(1);
        }
        let reason = finish_reason(finish, !parsed.tool_calls.is_empty());
        chunks.push(self.chunk(json!({}), Some(reason)));
        (chunks, parsed)
    }

    fn warnings(&self, parsed: &ParsedOutput) -> Vec<String> {
        let mut warnings = parsed.warnings.clone();
        if parsed.truncated_tool_call {
            warnings.push(
                "the output ended (max_tokens) inside a tool call; that call was dropped".into(),
            );
        }
        if self.tool_call_required && parsed.tool_calls.is_empty() {
            warnings.push("tool_choice required a tool call but the model produced none".into());
        }
        warnings
    }

    /// The non-streaming `chat.completion` object.
    pub fn into_response(mut self, output: &GenOutput) -> Value {
        let (_, parsed) = self.finish_chunks(&output.finish);
        let tool_calls: Vec<Value> = parsed
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                json!({
                    "id": self.tool_id(i),
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": Value::Object(call.arguments.clone()).to_string(),
                    },
                })
            })
            .collect();
        let mut message = json!({
            "role": "assistant",
            "content": if parsed.content.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::String(parsed.content.clone()) },
        });
        if let Some(r) = parsed.reasoning.as_ref().filter(|r| !r.is_empty()) {
            message["reasoning_content"] = json!(r);
        }
        if !tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(tool_calls.clone());
        }
        let mut response = json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "seed": output.seed,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(&output.finish, !tool_calls.is_empty()),
            }],
            "usage": usage_json(&output.usage),
        });
        let warnings = self.warnings(&parsed);
        if !warnings.is_empty() {
            response["warnings"] = json!(warnings);
        }
        response
    }
}

fn data(value: &Value) -> Event {
    Event::default().data(value.to_string())
}

struct ChatStreamer {
    assembler: ChatAssembler,
    include_usage: bool,
    seed: u64,
    tokenizer: crate::tokenizer::Tokenizer,
    /// Log-probabilities of tokens whose text has not been sent in a chunk yet.
    pending_logprobs: Vec<TokenLogprobs>,
}

impl ChatStreamer {
    /// Put the pending log-probabilities on the first of `chunks`.
    fn attach_logprobs(&mut self, chunks: &mut [Value]) {
        if self.pending_logprobs.is_empty() {
            return;
        }
        if let Some(first) = chunks.first_mut() {
            first["choices"][0]["logprobs"] =
                logprobs::chat_logprobs(&self.tokenizer, &self.pending_logprobs);
            self.pending_logprobs.clear();
        }
    }
}

/// Progress is streamed only for prompts long enough to take more than one prefill chunk.
fn worth_reporting(progress: &Progress) -> bool {
    progress.total - progress.cached > crate::engine::generate::PREFILL_CHUNK
}

impl SseAssembler for ChatStreamer {
    fn start(&mut self) -> Vec<Event> {
        vec![data(&self.assembler.first_chunk())]
    }

    fn progress(&mut self, progress: &Progress) -> Vec<Event> {
        if !worth_reporting(progress) {
            return Vec::new();
        }
        let mut chunk = self.assembler.chunk(json!({}), None);
        chunk["prompt_progress"] = progress.json();
        vec![data(&chunk)]
    }

    fn logprobs(&mut self, logprobs: TokenLogprobs) {
        self.pending_logprobs.push(logprobs);
    }

    fn text(&mut self, text: &str) -> Vec<Event> {
        let mut chunks = self.assembler.push_text(text);
        self.attach_logprobs(&mut chunks);
        chunks.iter().map(data).collect()
    }

    fn done(&mut self, result: Result<GenOutput, ApiError>) -> Vec<Event> {
        let mut events = Vec::new();
        match result {
            Ok(output) => {
                let (mut chunks, _) = self.assembler.finish_chunks(&output.finish);
                self.attach_logprobs(&mut chunks);
                events.extend(chunks.iter().map(data));
                if self.include_usage {
                    let mut usage_chunk = self.assembler.chunk(json!({}), None);
                    usage_chunk["choices"] = json!([]);
                    usage_chunk["usage"] = usage_json(&output.usage);
                    usage_chunk["seed"] = json!(self.seed);
                    events.push(data(&usage_chunk));
                }
            }
            Err(e) => events.push(data(&e.body())),
        }
        events.push(Event::default().data("[DONE]"));
        events
    }
}

// ---------------------------------------------------------------------------------------------
// /v1/completions

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Value,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub stop: Option<Value>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub echo: Option<bool>,
    /// Log-probabilities of the sampled token and of this many most likely ones (0–5).
    #[serde(default)]
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub response_format: Option<Value>,
    #[serde(default)]
    pub grammar: Option<Value>,
    #[serde(default)]
    pub regex: Option<Value>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default, deserialize_with = "deserialize_seed")]
    pub seed: Option<u64>,
}

fn completion_prompt_ids(model: &LoadedModel, prompt: &Value) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| {
        model.tokenizer.encode(text, true).map_err(|e| {
            ApiError::invalid_param("prompt", format!("cannot tokenize the prompt: {e}"))
        })
    };
    let bad = || {
        ApiError::invalid_param(
            "prompt",
            "prompt must be a string, an array with one string, or an array of token ids",
        )
    };
    match prompt {
        Value::String(s) => encode(s),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            encode(items[0].as_str().unwrap_or_default())
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            let vocab = model.vocab_size;
            items
                .iter()
                .map(|v| {
                    let id = v.as_u64().ok_or_else(bad)?;
                    if id >= vocab as u64 {
                        return Err(ApiError::invalid_param(
                            "prompt",
                            format!("token id {id} is outside the vocabulary ({vocab})"),
                        ));
                    }
                    Ok(id as u32)
                })
                .collect()
        }
        _ => Err(bad()),
    }
}

pub async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(body, FLAVOR)?;
    let model = state.model()?;
    if let Some(n) = req.n
        && n != 1
    {
        return Err(ApiError::invalid_param(
            "n",
            format!("n = {n} is not supported: this server returns exactly one choice"),
        ));
    }
    let ids = completion_prompt_ids(&model, &req.prompt)?;
    if ids.is_empty() {
        return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
    }
    let sampling = sampling_fields!(req).resolve(&model.defaults, FLAVOR)?;
    let seed = sampling.seed.unwrap_or_default();
    let logprobs = match req.logprobs {
        None => None,
        Some(n) if (0..=MAX_COMPLETION_LOGPROBS).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {n}"),
            ));
        }
    };
    let constraint = output_constraint(
        &model,
        req.response_format.as_ref(),
        req.grammar.as_ref(),
        req.regex.as_ref(),
    )?;
    let max_tokens = resolve_max_tokens(req.max_tokens, "max_tokens", &model, ids.len(), FLAVOR)?;
    check_context(&model, ids.len(), max_tokens, FLAVOR)?;
    let job = GenerateRequest {
        prompt: ids,
        max_tokens,
        sampling,
        stop_ids: model.tokenizer.stop_ids(),
        stop_strings: parse_stop(req.stop.as_ref(), "stop", FLAVOR)?,
        checkpoint: None,
    };
    let echo = if req.echo.unwrap_or(false) {
        match &req.prompt {
            Value::String(s) => s.clone(),
            _ => String::new(),
        }
    } else {
        String::new()
    };
    let streamer = CompletionStreamer {
        id: random_id("cmpl-"),
        created: unix_time(),
        model: model.name.clone(),
        include_usage: req.stream_options.map(|o| o.include_usage).unwrap_or(false),
        echo,
        tokenizer: model.tokenizer.clone(),
        pending_logprobs: Vec::new(),
        text_len: 0,
    };
    let job = Job {
        request: job,
        options: GenerationOptions {
            logprobs,
            constraint,
        },
    };
    let handle = start_job(&state, model.clone(), job, FLAVOR)?;
    if req.stream.unwrap_or(false) {
        return Ok((seed_headers(seed), sse_response(handle, streamer)).into_response());
    }
    let (text, output) = collect(handle).await?;
    let body = json!({
        "id": streamer.id,
        "object": "text_completion",
        "created": streamer.created,
        "model": streamer.model,
        "system_fingerprint": "strata",
        "seed": output.seed,
        "choices": [{
            "index": 0,
            "text": format!("{}{text}", streamer.echo),
            "logprobs": match logprobs {
                Some(_) => logprobs::completion_logprobs(&model.tokenizer, &output.logprobs, streamer.echo.len()),
                None => Value::Null,
            },
            "finish_reason": finish_reason(&output.finish, false),
        }],
        "usage": usage_json(&output.usage),
    });
    Ok((seed_headers(seed), axum::Json(body)).into_response())
}

struct CompletionStreamer {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    echo: String,
    tokenizer: crate::tokenizer::Tokenizer,
    pending_logprobs: Vec<TokenLogprobs>,
    /// Text sent so far (for `text_offset`).
    text_len: usize,
}

impl CompletionStreamer {
    fn chunk(&self, text: &str, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "strata",
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason }],
        })
    }
}

impl SseAssembler for CompletionStreamer {
    fn start(&mut self) -> Vec<Event> {
        if self.echo.is_empty() {
            Vec::new()
        } else {
            vec![data(&self.chunk(&self.echo, None))]
        }
    }

    fn logprobs(&mut self, logprobs: TokenLogprobs) {
        self.pending_logprobs.push(logprobs);
    }

    fn progress(&mut self, progress: &Progress) -> Vec<Event> {
        if !worth_reporting(progress) {
            return Vec::new();
        }
        let mut chunk = self.chunk("", None);
        chunk["prompt_progress"] = progress.json();
        vec![data(&chunk)]
    }

    fn text(&mut self, text: &str) -> Vec<Event> {
        let mut chunk = self.chunk(text, None);
        if !self.pending_logprobs.is_empty() {
            let offset = self.echo.len() + self.text_len;
            chunk["choices"][0]["logprobs"] =
                logprobs::completion_logprobs(&self.tokenizer, &self.pending_logprobs, offset);
            self.pending_logprobs.clear();
        }
        self.text_len += text.len();
        vec![data(&chunk)]
    }

    fn done(&mut self, result: Result<GenOutput, ApiError>) -> Vec<Event> {
        let mut events = Vec::new();
        match result {
            Ok(output) => {
                let mut last = self.chunk("", Some(finish_reason(&output.finish, false)));
                if !self.pending_logprobs.is_empty() {
                    let offset = self.echo.len() + self.text_len;
                    last["choices"][0]["logprobs"] = logprobs::completion_logprobs(
                        &self.tokenizer,
                        &self.pending_logprobs,
                        offset,
                    );
                    self.pending_logprobs.clear();
                }
                events.push(data(&last));
                if self.include_usage {
                    let mut usage_chunk = self.chunk("", None);
                    usage_chunk["choices"] = json!([]);
                    usage_chunk["usage"] = usage_json(&output.usage);
                    events.push(data(&usage_chunk));
                }
            }
            Err(e) => events.push(data(&e.body())),
        }
        events.push(Event::default().data("[DONE]"));
        events
    }
}

/// The `/v1/models` entry for the loaded model.
fn model_object(model: &LoadedModel) -> Value {
    json!({
        "id": model.name,
        "object": "model",
        "created": 0,
        "owned_by": "strata",
        "context_length": model.context_length,
    })
}

pub async fn models(State(state): State<AppState>) -> Result<Response, ApiError> {
    let model = state.model()?;
    Ok(axum::Json(json!({
        "object": "list",
        "data": [model_object(&model)],
    }))
    .into_response())
}

/// `GET /v1/models/{id}` (`client.models.retrieve`): the loaded model under its own name, 404
/// for any other.
pub async fn model_by_id(
    State(state): State<AppState>,
    axum::extract::Path(model_id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let model = state.model()?;
    if model_id != model.name {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!(
                "model {model_id:?} is not served here; this server serves {:?}",
                model.name
            ),
        )
        .with_code("model_not_found")
        .with_param("model"));
    }
    Ok(axum::Json(model_object(&model)).into_response())
}
