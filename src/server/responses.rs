//! `POST /v1/responses` (OpenAI Responses API) on top of the chat path: input items (messages,
//! `function_call`, `function_call_output`, `reasoning`) become chat messages, function tools
//! become chat tools, and the output is returned as `reasoning` / `message` / `function_call`
//! items, or streamed as `response.*` events. Recent conversations are kept in memory so a
//! request can continue one with `previous_response_id`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::openai::{
    ChatCompletionRequest, SseAssembler, collect, prepare_chat_request, sse_response,
};
use super::{
    ApiError, AppState, Flavor, Job, parse_body, random_id, seed_headers, start_job, unix_time,
};
use crate::chat::toolcall::{ParsedOutput, StreamEvent, StreamParser};
use crate::engine::generate::{FinishReason, GenOutput, Usage};

const FLAVOR: Flavor = Flavor::OpenAi;
/// Conversations kept for `previous_response_id`.
pub const STORED_RESPONSES: usize = 256;

#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub input: Value,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub max_output_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub reasoning: Option<Value>,
    #[serde(default)]
    pub text: Option<Value>,
    #[serde(default)]
    pub seed: Option<Value>,
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// The chat messages of recent responses (input and output), by response id.
#[derive(Default)]
pub struct ResponseStore {
    conversations: HashMap<String, Vec<Value>>,
    order: VecDeque<String>,
}

impl ResponseStore {
    fn get(&self, id: &str) -> Option<Vec<Value>> {
        self.conversations.get(id).cloned()
    }

    fn put(&mut self, id: String, messages: Vec<Value>) {
        self.order.push_back(id.clone());
        self.conversations.insert(id, messages);
        while self.order.len() > STORED_RESPONSES {
            if let Some(old) = self.order.pop_front() {
                self.conversations.remove(&old);
            }
        }
    }
}

fn lock(store: &Mutex<ResponseStore>) -> std::sync::MutexGuard<'_, ResponseStore> {
    match store.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Text of a Responses content value: a string or `input_text` / `output_text` parts.
fn item_text(content: Option<&Value>) -> Value {
    match content {
        Some(Value::Array(parts)) => Value::String(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        Some(v) => v.clone(),
        None => Value::Null,
    }
}

fn bad_item(i: usize, message: &str) -> ApiError {
    ApiError::invalid_param(&format!("input[{i}]"), format!("input[{i}] {message}"))
}

/// Append one input item to the chat messages.
fn push_item(messages: &mut Vec<Value>, i: usize, item: &Value) -> Result<(), ApiError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let str_field = |name: &str| {
        item.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| bad_item(i, &format!("({kind}) needs a \"{name}\" string")))
    };
    match kind {
        "message" => {
            let role = str_field("role")?;
            messages.push(json!({"role": role, "content": item_text(item.get("content"))}));
        }
        "function_call" => {
            let call = json!({"id": str_field("call_id")?, "type": "function",
                "function": {"name": str_field("name")?, "arguments": str_field("arguments")?}});
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" && last.get("tool_calls").is_some() => {
                    if let Some(calls) = last["tool_calls"].as_array_mut() {
                        calls.push(call);
                    }
                }
                _ => messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::String(s)) => Value::String(s.clone()),
                other => item_text(other),
            };
            messages.push(
                json!({"role": "tool", "tool_call_id": str_field("call_id")?, "content": output}),
            );
        }
        "reasoning" => {
            let text: String = ["content", "summary"]
                .iter()
                .filter_map(|k| item.get(*k).and_then(Value::as_array))
                .flatten()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            messages.push(json!({"role": "assistant", "content": null, "reasoning_content": text}));
        }
        other => return Err(bad_item(i, &format!("has unsupported type {other:?}"))),
    }
    Ok(())
}

/// Merge a reasoning-only assistant message into the assistant message that follows it.
fn merge_reasoning(messages: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    for m in messages {
        if let Some(prev) = out.last_mut()
            && prev["role"] == "assistant"
            && prev["content"].is_null()
            && prev.get("tool_calls").is_none()
            && m["role"] == "assistant"
        {
            let reasoning = prev["reasoning_content"].clone();
            *prev = m;
            if prev.get("reasoning_content").is_none() {
                prev["reasoning_content"] = reasoning;
            }
            continue;
        }
        out.push(m);
    }
    out
}

fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    match input {
        Value::String(s) => messages.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut messages, i, item)?;
            }
        }
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "input must be a string or an array of input items",
            ));
        }
    }
    Ok(merge_reasoning(messages))
}

/// Responses function tools (`{type, name, parameters}`) → chat tools.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| match t.get("type").and_then(Value::as_str) {
            Some("function") => Ok(json!({"type": "function", "function": {
                "name": t.get("name").cloned().unwrap_or(Value::Null),
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("parameters").cloned().unwrap_or(json!({"type": "object"})),
            }})),
            other => Err(ApiError::invalid_param(
                &format!("tools[{i}].type"),
                format!("tools[{i}] has type {other:?}; only function tools are supported"),
            )),
        })
        .collect()
}

/// `text.format` → chat `response_format`.
fn response_format(text: Option<&Value>) -> Option<Value> {
    let format = text?.get("format")?;
    match format.get("type").and_then(Value::as_str)? {
        "json_schema" => Some(json!({"type": "json_schema", "json_schema": {
            "name": format.get("name"), "schema": format.get("schema"), "strict": format.get("strict"),
        }})),
        other => Some(json!({"type": other})),
    }
}

/// The chat request this Responses request amounts to (history + input).
fn chat_request(req: &ResponsesRequest, mut messages: Vec<Value>) -> Result<Value, ApiError> {
    if let Some(instructions) = &req.instructions {
        messages.insert(0, json!({"role": "system", "content": instructions}));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v.filter(|v| !v.is_null()) {
            chat.insert(k.into(), v);
        }
    };
    put(
        "tools",
        req.tools
            .as_deref()
            .map(chat_tools)
            .transpose()?
            .map(Value::Array),
    );
    put("tool_choice", req.tool_choice.clone());
    put(
        "parallel_tool_calls",
        req.parallel_tool_calls.map(Value::Bool),
    );
    put("max_tokens", req.max_output_tokens.map(Value::from));
    put("temperature", req.temperature.map(Value::from));
    put("top_p", req.top_p.map(Value::from));
    put("reasoning", req.reasoning.clone());
    put("seed", req.seed.clone());
    put("response_format", response_format(req.text.as_ref()));
    Ok(Value::Object(chat))
}

pub async fn responses(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_body(body, FLAVOR)?;
    let model = state.model()?;
    let mut messages = match &req.previous_response_id {
        Some(id) => lock(state.responses()).get(id).ok_or_else(|| {
            ApiError::invalid_param(
                "previous_response_id",
                format!("no stored response {id:?} (only the last {STORED_RESPONSES} are kept)"),
            )
            .with_code("previous_response_not_found")
        })?,
        None => Vec::new(),
    };
    messages.extend(input_messages(&req.input)?);
    let chat_json = chat_request(&req, messages.clone())?;
    let chat_req: ChatCompletionRequest = serde_json::from_value(chat_json)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let chat = prepare_chat_request(&model, chat_req)?;
    let seed = chat.job.sampling.seed.unwrap_or_default();
    let mut assembler = ResponseAssembler {
        id: random_id("resp_"),
        created: unix_time(),
        model: model.name.clone(),
        request: echo_fields(&req),
        parser: Some(StreamParser::new(
            chat.prepared.starts_in_reasoning,
            chat.prepared.tool_specs.clone(),
        )),
        items: Vec::new(),
        sequence: 0,
        store: Some((state.clone(), messages)),
    };
    let job = Job {
        request: chat.job,
        options: chat.options,
    };
    let handle = start_job(&state, model.clone(), job, FLAVOR)?;
    if req.stream.unwrap_or(false) {
        return Ok((seed_headers(seed), sse_response(handle, assembler)).into_response());
    }
    let (text, output) = collect(handle).await?;
    assembler.push_events(&text);
    let body = assembler.complete(&output);
    Ok((seed_headers(seed), axum::Json(body)).into_response())
}

/// Request fields echoed in the response object.
fn echo_fields(req: &ResponsesRequest) -> Value {
    json!({
        "instructions": req.instructions,
        "previous_response_id": req.previous_response_id,
        "tools": req.tools.clone().unwrap_or_default(),
        "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata.clone().unwrap_or(json!({})),
        "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
        "reasoning": req.reasoning.clone().unwrap_or(json!({"effort": null, "summary": null})),
    })
}

/// One output item being built.
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Item {
    fn json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text } => json!({"type": "reasoning", "id": id, "status": status,
                "summary": [], "content": [{"type": "reasoning_text", "text": text}]}),
            Item::Message { id, text } => json!({"type": "message", "id": id, "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({"type": "function_call",
                "id": id, "call_id": call_id, "name": name, "arguments": arguments,
                "status": status}),
        }
    }

    /// The item as opened (no text yet), for `response.output_item.added`.
    fn opened(&self) -> Value {
        let mut v = self.json("in_progress");
        match self {
            Item::Reasoning { .. } => v["content"] = json!([]),
            Item::Message { .. } => v["content"] = json!([]),
            Item::Call { .. } => v["arguments"] = json!(""),
        }
        v
    }
}

type Named = (&'static str, Value);

struct ResponseAssembler {
    id: String,
    created: u64,
    model: String,
    request: Value,
    parser: Option<StreamParser>,
    items: Vec<Item>,
    sequence: u64,
    /// Where to keep the conversation once complete.
    store: Option<(AppState, Vec<Value>)>,
}

impl ResponseAssembler {
    fn response(&self, status: &str, usage: Option<&Usage>, incomplete: Option<&str>) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "output": self.items.iter().map(|i| i.json("completed")).collect::<Vec<_>>(),
            "usage": usage.map(usage_json), "store": true,
        });
        if let (Value::Object(r), Value::Object(extra)) = (&mut r, &self.request) {
            r.extend(extra.clone());
        }
        r
    }

    fn open(&mut self, item: Item, out: &mut Vec<Named>) {
        let index = self.items.len();
        out.push((
            "response.output_item.added",
            json!({"output_index": index, "item": item.opened()}),
        ));
        if let Item::Message { id, .. } = &item {
            out.push(("response.content_part.added", json!({"item_id": id, "output_index": index,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})));
        }
        self.items.push(item);
    }

    /// Close the last item if it is not of the kind about to be written.
    fn close_last(&mut self, out: &mut Vec<Named>) {
        let index = self.items.len().saturating_sub(1);
        let Some(item) = self.items.last() else {
            return;
        };
        match item {
            Item::Reasoning { id, text } => out.push((
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            )),
            Item::Message { id, text } => {
                out.push((
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index,
                    "content_index": 0, "text": text}),
                ));
                out.push(("response.content_part.done", json!({"item_id": id, "output_index": index,
                    "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}})));
            }
            Item::Call { id, arguments, .. } => out.push((
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": arguments}),
            )),
        }
        out.push((
            "response.output_item.done",
            json!({"output_index": index, "item": item.json("completed")}),
        ));
    }

    fn on_text(&mut self, reasoning: bool, delta: String, out: &mut Vec<Named>) {
        let open = match self.items.last() {
            Some(Item::Reasoning { .. }) => reasoning,
            Some(Item::Message { .. }) => !reasoning,
            _ => false,
        };
        if !open {
            if !self.items.is_empty() {
                self.close_last(out);
            }
            let item = if reasoning {
                Item::Reasoning {
                    id: random_id("rs_"),
                    text: String::new(),
                }
            } else {
                Item::Message {
                    id: random_id("msg_"),
                    text: String::new(),
                }
            };
            self.open(item, out);
        }
        let index = self.items.len() - 1;
        let (name, item_id) = match self.items.last_mut() {
            Some(Item::Reasoning { id, text }) => {
                text.push_str(&delta);
                ("response.reasoning_text.delta", id.clone())
            }
            Some(Item::Message { id, text }) => {
                text.push_str(&delta);
                ("response.output_text.delta", id.clone())
            }
            _ => return,
        };
        out.push((
            name,
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
    }

    fn on_event(&mut self, event: StreamEvent, out: &mut Vec<Named>) {
        match event {
            StreamEvent::Reasoning(t) => self.on_text(true, t, out),
            StreamEvent::Content(t) => self.on_text(false, t, out),
            StreamEvent::ToolCallStart { name, .. } => {
                if !self.items.is_empty() {
                    self.close_last(out);
                }
                let item = Item::Call {
                    id: random_id("fc_"),
                    call_id: random_id("call_"),
                    name,
                    arguments: String::new(),
                };
                self.open(item, out);
            }
            StreamEvent::ToolCallArguments { json_fragment, .. } => {
                let index = self.items.len().saturating_sub(1);
                if let Some(Item::Call { id, arguments, .. }) = self.items.last_mut() {
                    arguments.push_str(&json_fragment);
                    out.push((
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": json_fragment}),
                    ));
                }
            }
            StreamEvent::ToolCallEnd { .. } => {}
        }
    }

    fn push_events(&mut self, text: &str) -> Vec<Named> {
        let events = match self.parser.as_mut() {
            Some(p) => p.push(text),
            None => Vec::new(),
        };
        let mut out = Vec::new();
        for e in events {
            self.on_event(e, &mut out);
        }
        out
    }

    /// Finish the parser, replace the streamed calls by the parsed ones (validated, with
    /// arguments as complete JSON), keep the conversation and return the final response.
    fn finish(&mut self, output: &GenOutput, out: &mut Vec<Named>) -> Value {
        let parsed = match self.parser.take() {
            Some(p) => {
                let (events, parsed) = p.finish(output.finish == FinishReason::Length);
                for e in events {
                    self.on_event(e, out);
                }
                parsed
            }
            None => ParsedOutput::default(),
        };
        self.reconcile_calls(&parsed);
        if !self.items.is_empty() {
            self.close_last(out);
        }
        self.remember();
        let incomplete = (output.finish == FinishReason::Length).then_some("max_output_tokens");
        let status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        self.response(status, Some(&output.usage), incomplete)
    }

    fn reconcile_calls(&mut self, parsed: &ParsedOutput) {
        let mut calls = parsed.tool_calls.iter();
        self.items.retain_mut(|item| match item {
            Item::Call {
                name, arguments, ..
            } => match calls.next() {
                Some(call) => {
                    *name = call.name.clone();
                    *arguments = Value::Object(call.arguments.clone()).to_string();
                    true
                }
                None => false,
            },
            _ => true,
        });
    }

    /// Keep the conversation (input + this output) for `previous_response_id`.
    fn remember(&mut self) {
        let Some((state, mut messages)) = self.store.take() else {
            return;
        };
        let mut assistant = json!({"role": "assistant", "content": null});
        let mut calls = Vec::new();
        for item in &self.items {
            match item {
                Item::Reasoning { text, .. } => assistant["reasoning_content"] = json!(text),
                Item::Message { text, .. } => assistant["content"] = json!(text),
                Item::Call {
                    call_id,
                    name,
                    arguments,
                    ..
                } => calls.push(json!({"id": call_id,
                    "type": "function", "function": {"name": name, "arguments": arguments}})),
            }
        }
        if !calls.is_empty() {
            assistant["tool_calls"] = Value::Array(calls);
        }
        messages.push(assistant);
        lock(state.responses()).put(self.id.clone(), messages);
    }

    fn complete(mut self, output: &GenOutput) -> Value {
        let mut ignored = Vec::new();
        self.finish(output, &mut ignored)
    }

    fn sse(&mut self, events: Vec<Named>) -> Vec<Event> {
        events
            .into_iter()
            .map(|(name, mut data)| {
                data["type"] = json!(name);
                data["sequence_number"] = json!(self.sequence);
                self.sequence += 1;
                Event::default().event(name).data(data.to_string())
            })
            .collect()
    }
}

impl SseAssembler for ResponseAssembler {
    fn start(&mut self) -> Vec<Event> {
        let r = self.response("in_progress", None, None);
        self.sse(vec![
            ("response.created", json!({"response": r})),
            ("response.in_progress", json!({"response": r})),
        ])
    }

    fn text(&mut self, text: &str) -> Vec<Event> {
        let events = self.push_events(text);
        self.sse(events)
    }

    fn done(&mut self, result: Result<GenOutput, ApiError>) -> Vec<Event> {
        let mut out = Vec::new();
        match result {
            Ok(output) => {
                let r = self.finish(&output, &mut out);
                // Always `response.completed` (its `status` says `incomplete` when cut short):
                // the official clients' stream helpers wait for exactly that event.
                out.push(("response.completed", json!({"response": r})));
            }
            Err(e) => {
                let mut r = self.response("failed", None, None);
                r["error"] =
                    json!({"code": e.code.unwrap_or("server_error"), "message": e.message});
                out.push(("response.failed", json!({"response": r})));
            }
        }
        self.sse(out)
    }
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}
