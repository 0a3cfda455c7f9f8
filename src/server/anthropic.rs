//! Anthropic-compatible endpoints: `/v1/messages` (also with `?beta=true`, as Claude Code sends)
//! and `/v1/messages/count_tokens`.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::openai::{SseAssembler, collect, parse_stop, sse_response};
use super::prompt::{self, ChatPrompt, PreparedPrompt, ToolChoice};
use super::structured;
use super::{
    ApiError, AppState, Flavor, Job, LoadedModel, check_context, parse_body, random_id,
    seed_headers, start_job,
};
use crate::chat::toolcall::{ParsedOutput, StreamEvent, StreamParser, ToolSpec};
use crate::chat::{Message, ToolCall};
use crate::engine::generate::{FinishReason, GenOutput, GenerateRequest, Usage};
use crate::engine::generation::{GenerationOptions, TokenConstraint};

const FLAVOR: Flavor = Flavor::Anthropic;

fn invalid(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message).with_flavor(FLAVOR)
}

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// Required by `/v1/messages`, ignored by `count_tokens`.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    pub messages: Vec<Value>,
    #[serde(default)]
    pub system: Option<Value>,
    #[serde(default)]
    pub stop_sequences: Option<Value>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub thinking: Option<Value>,
    /// `{"effort": "low"|"medium"|"high"}`.
    #[serde(default)]
    pub output_config: Option<Value>,
    /// Not part of Anthropic's API; honoured so runs can be replayed.
    #[serde(default, deserialize_with = "super::openai::deserialize_seed")]
    pub seed: Option<u64>,
}

/// Text of `system`: a string or an array of text blocks.
fn system_text(system: Option<&Value>) -> Result<Option<String>, ApiError> {
    match system {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                let text = b.get("text").and_then(Value::as_str).ok_or_else(|| {
                    invalid("system", format!("system[{i}] must be a text block"))
                })?;
                parts.push(text);
            }
            Ok(Some(parts.join("\n\n")))
        }
        Some(_) => Err(invalid(
            "system",
            "system must be a string or an array of text blocks",
        )),
    }
}

/// A tool_result's content: a string or text blocks.
fn tool_result_text(content: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut text = Vec::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push(b.get("text").and_then(Value::as_str).unwrap_or_default())
                    }
                    Some("image") => {
                        return Err(invalid(
                            param,
                            "image input is not supported by this server",
                        ));
                    }
                    _ => return Err(invalid(param, format!("{param} has an unsupported block"))),
                }
            }
            Ok(text.join("\n"))
        }
        Some(_) => Err(invalid(
            param,
            format!("{param} must be a string or blocks"),
        )),
    }
}

/// Anthropic messages (+ system) → template messages.
pub fn convert_messages(
    system: Option<&Value>,
    messages: &[Value],
) -> Result<Vec<Message>, ApiError> {
    if messages.is_empty() {
        return Err(invalid(
            "messages",
            "messages must contain at least one message",
        ));
    }
    let mut out = Vec::new();
    if let Some(text) = system_text(system)? {
        out.push(Message {
            role: "system".into(),
            content: Some(text),
            ..Message::default()
        });
    }
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
            invalid(
                &format!("{param}.role"),
                format!("{param} has no \"role\" string"),
            )
        })?;
        if role != "user" && role != "assistant" {
            return Err(invalid(
                &format!("{param}.role"),
                format!(
                    "{param} has role {role:?}; expected user or assistant (system goes in the top-level \"system\" field)"
                ),
            ));
        }
        let blocks: Vec<Value> = match m.get("content") {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(a)) if a.is_empty() => {
                return Err(invalid(
                    &format!("{param}.content"),
                    format!("{param}.content is empty; a message needs at least one content block"),
                ));
            }
            Some(Value::Array(a)) => a.clone(),
            _ => {
                return Err(invalid(
                    &format!("{param}.content"),
                    format!("{param}.content must be a string or an array of content blocks"),
                ));
            }
        };
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut tool_calls = Vec::new();
        let mut tool_results = Vec::new();
        for (j, block) in blocks.iter().enumerate() {
            let bparam = format!("{param}.content[{j}]");
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            match (role, kind) {
                (_, "text") => {
                    let t = block.get("text").and_then(Value::as_str).ok_or_else(|| {
                        invalid(
                            &bparam,
                            format!("{bparam} is a text block without \"text\""),
                        )
                    })?;
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(t);
                }
                ("assistant", "thinking") => {
                    reasoning.push_str(block.get("thinking").and_then(Value::as_str).unwrap_or(""));
                }
                ("assistant", "redacted_thinking") => {}
                ("assistant", "tool_use") => {
                    let name = block.get("name").and_then(Value::as_str).ok_or_else(|| {
                        invalid(
                            &bparam,
                            format!("{bparam} is a tool_use block without a name"),
                        )
                    })?;
                    let input =
                        prompt::arguments_to_object(block.get("input").unwrap_or(&Value::Null))
                            .map_err(|e| invalid(&bparam, format!("{bparam}.input: {e}")))?;
                    tool_calls.push(ToolCall {
                        id: block
                            .get("id")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        name: name.to_string(),
                        arguments: input,
                    });
                }
                ("user", "tool_result") => {
                    let mut content = tool_result_text(block.get("content"), &bparam)?;
                    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    tool_results.push(Message {
                        role: "tool".into(),
                        content: Some(content),
                        tool_call_id: block
                            .get("tool_use_id")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        ..Message::default()
                    });
                }
                (_, "image" | "document") => {
                    return Err(invalid(
                        &bparam,
                        "image and document input is not supported by this server",
                    ));
                }
                _ => {
                    return Err(invalid(
                        &bparam,
                        format!("{bparam} has type {kind:?}, which a {role} message cannot carry"),
                    ));
                }
            }
        }
        // Tool results come first (they answer the previous assistant turn), then any text.
        out.extend(tool_results);
        if role == "assistant" {
            out.push(Message {
                role: "assistant".into(),
                content: Some(text),
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls,
                ..Message::default()
            });
        } else if !text.is_empty() {
            out.push(Message {
                role: "user".into(),
                content: Some(text),
                ..Message::default()
            });
        }
    }
    Ok(prompt::normalise_roles(out))
}

/// Anthropic tools → OpenAI form (what the template and parser take).
fn convert_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                invalid(&format!("tools[{i}]"), format!("tools[{i}] has no name"))
            })?;
            let mut function = Map::new();
            function.insert("name".into(), json!(name));
            if let Some(d) = t.get("description") {
                function.insert("description".into(), d.clone());
            }
            function.insert(
                "parameters".into(),
                t.get("input_schema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            );
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

fn parse_tool_choice(value: Option<&Value>) -> Result<(Option<ToolChoice>, bool), ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok((None, true));
    };
    let parallel = value
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        != Some(true);
    let choice = match value.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => ToolChoice::Named(
            value
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice", "tool_choice of type tool needs a name"))?
                .to_string(),
        ),
        _ => {
            return Err(invalid(
                "tool_choice",
                "tool_choice.type must be auto, any, tool or none",
            ));
        }
    };
    Ok((Some(choice), parallel))
}

/// `thinking` → (enable_thinking, effort): a budget under 2K tokens is low effort, under 8K
/// medium, more is the template's xhigh.
fn thinking_options(
    thinking: Option<&Value>,
    output_config: Option<&Value>,
) -> Result<(Option<bool>, Option<String>), ApiError> {
    let mut result = (None, None);
    if let Some(t) = thinking.filter(|v| !v.is_null()) {
        result = match t.get("type").and_then(Value::as_str) {
            Some("disabled") => (Some(false), None),
            Some("enabled") => {
                let budget = t.get("budget_tokens").and_then(Value::as_u64);
                let effort = match budget {
                    Some(b) if b < 2048 => "low",
                    Some(b) if b < 8192 => "medium",
                    _ => "xhigh",
                };
                (Some(true), Some(effort.to_string()))
            }
            Some("adaptive") => (Some(true), None),
            _ => {
                return Err(invalid(
                    "thinking",
                    "thinking.type must be enabled, disabled or adaptive",
                ));
            }
        };
    }
    if let Some(effort) = output_config
        .and_then(|c| c.get("effort"))
        .and_then(Value::as_str)
    {
        let (enable, effort) =
            prompt::map_reasoning_effort(effort).map_err(|e| invalid("output_config.effort", e))?;
        result = (result.0.or(enable), effort);
    }
    Ok(result)
}

/// Render and tokenize (shared by messages and count_tokens).
fn prepare(model: &LoadedModel, req: &MessagesRequest) -> Result<(PreparedPrompt, bool), ApiError> {
    let mut messages = convert_messages(req.system.as_ref(), &req.messages)?;
    // A conversation that ends with an assistant turn asks for that turn to be continued
    // ("prefill"): the model writes on from its text instead of starting a new turn.
    let assistant_prefill = match messages.last() {
        Some(last)
            if last.role == "assistant"
                && last.tool_calls.is_empty()
                && messages
                    .iter()
                    .any(|m| m.role == "user" || m.role == "tool")
                && last.content.as_deref().is_some_and(|c| !c.is_empty()) =>
        {
            messages.pop().and_then(|m| m.content)
        }
        _ => None,
    };
    let tools = convert_tools(req.tools.as_deref().unwrap_or_default())?;
    let (tool_choice, parallel) = parse_tool_choice(req.tool_choice.as_ref())?;
    let (mut enable_thinking, reasoning_effort) =
        thinking_options(req.thinking.as_ref(), req.output_config.as_ref())?;
    // A forced tool is enforced by a grammar over the whole output: no thinking before it.
    if matches!(tool_choice, Some(ToolChoice::Named(_))) && enable_thinking.is_none() {
        enable_thinking = Some(false);
    }
    // A prefill is the start of the visible answer, which comes after the reasoning: unless the
    // client asked for thinking, close the think block so the prefill is answer text.
    if assistant_prefill.is_some() && enable_thinking.is_none() {
        enable_thinking = Some(false);
    }
    let chat = ChatPrompt {
        messages,
        tools,
        tool_choice,
        enable_thinking,
        reasoning_effort,
        extra: Map::new(),
        assistant_prefill,
    };
    Ok((prompt::prepare_chat(model, chat, FLAVOR)?, parallel))
}

/// `tool_choice: {"type": "tool", "name": N}` is enforced: the output is a call of N whose
/// input matches its `input_schema`.
fn forced_tool_constraint(
    model: &LoadedModel,
    req: &MessagesRequest,
    prepared: &PreparedPrompt,
) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
    let (choice, _) = parse_tool_choice(req.tool_choice.as_ref())?;
    let Some(ToolChoice::Named(name)) = choice else {
        return Ok(None);
    };
    let Some(format) = structured::forced_tool(req.tools.as_deref().unwrap_or_default(), &name)
    else {
        return Ok(None);
    };
    if prepared.starts_in_reasoning {
        return Err(invalid(
            "tool_choice",
            "this model's chat template always starts with thinking, which a forced tool cannot constrain",
        ));
    }
    let grammars = model.grammars().map_err(|e| e.with_flavor(FLAVOR))?;
    grammars
        .constraint(&format, "tool_choice")
        .map(Some)
        .map_err(|e| e.with_flavor(FLAVOR))
}

pub async fn count_tokens(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MessagesRequest = parse_body(body, FLAVOR)?;
    let model = state.model().map_err(|e| e.with_flavor(FLAVOR))?;
    let (prepared, _) = prepare(&model, &req)?;
    Ok(axum::Json(json!({ "input_tokens": prepared.ids.len() })).into_response())
}

pub async fn messages(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MessagesRequest = parse_body(body, FLAVOR)?;
    let model = state.model().map_err(|e| e.with_flavor(FLAVOR))?;
    let max_tokens = match req.max_tokens {
        None => return Err(invalid("max_tokens", "max_tokens is required")),
        Some(v) if v <= 0 => {
            return Err(invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {v}"),
            ));
        }
        Some(v) => usize::try_from(v).unwrap_or(usize::MAX),
    };
    let (prepared, parallel) = prepare(&model, &req)?;
    check_context(&model, prepared.ids.len(), max_tokens, FLAVOR)?;
    let constraint = forced_tool_constraint(&model, &req, &prepared)?;
    let sampling = super::openai::SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        seed: req.seed,
        ..Default::default()
    }
    .resolve(&model.defaults, FLAVOR)?;
    let seed = sampling.seed.unwrap_or_default();
    let job = GenerateRequest {
        prompt: prepared.ids.clone(),
        max_tokens,
        sampling,
        stop_ids: model.tokenizer.stop_ids(),
        stop_strings: parse_stop(req.stop_sequences.as_ref(), "stop_sequences", FLAVOR)?,
        checkpoint: prepared.checkpoint,
    };
    let assembler = MessageAssembler::new(
        &model.name,
        prepared.starts_in_reasoning,
        prepared.tool_specs.clone(),
        parallel,
        prepared.ids.len(),
    );
    let job = Job {
        request: job,
        options: GenerationOptions {
            logprobs: None,
            constraint,
        },
    };
    let handle = start_job(&state, model.clone(), job, FLAVOR)?;
    if req.stream.unwrap_or(false) {
        return Ok((seed_headers(seed), sse_response(handle, assembler)).into_response());
    }
    let (text, output) = collect(handle).await.map_err(|e| e.with_flavor(FLAVOR))?;
    let mut assembler = assembler;
    assembler.push_text(&text);
    Ok((
        seed_headers(seed),
        axum::Json(assembler.into_response(&output)),
    )
        .into_response())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum BlockKind {
    Thinking,
    Text,
    /// A tool_use block for the parser's call index.
    Tool(usize),
}

/// Model text → Anthropic message pieces (streaming events, or the whole message at the end).
pub struct MessageAssembler {
    id: String,
    model: String,
    prompt_tokens: usize,
    parser: Option<StreamParser>,
    parallel_tool_calls: bool,
    /// The open content block and its index.
    open: Option<(usize, BlockKind)>,
    next_index: usize,
    tool_ids: Vec<String>,
}

/// One SSE event as (event name, data).
pub type NamedEvent = (&'static str, Value);

impl MessageAssembler {
    pub fn new(
        model: &str,
        starts_in_reasoning: bool,
        tools: Vec<ToolSpec>,
        parallel_tool_calls: bool,
        prompt_tokens: usize,
    ) -> MessageAssembler {
        MessageAssembler {
            id: random_id("msg_"),
            model: model.to_string(),
            prompt_tokens,
            parser: Some(StreamParser::new(starts_in_reasoning, tools)),
            parallel_tool_calls,
            open: None,
            next_index: 0,
            tool_ids: Vec::new(),
        }
    }

    fn tool_id(&mut self, index: usize) -> String {
        while self.tool_ids.len() <= index {
            self.tool_ids.push(random_id("toolu_"));
        }
        self.tool_ids[index].clone()
    }

    /// `message_start` and the first `ping`.
    pub fn start_events(&self) -> Vec<NamedEvent> {
        vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                              "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
                }}),
            ),
            ("ping", json!({"type": "ping"})),
        ]
    }

    fn close_block(&mut self, out: &mut Vec<NamedEvent>) {
        if let Some((index, _)) = self.open.take() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn ensure_block(&mut self, kind: BlockKind, out: &mut Vec<NamedEvent>, start: Value) -> usize {
        if let Some((index, open_kind)) = self.open
            && open_kind == kind
        {
            return index;
        }
        self.close_block(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, kind));
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        index
    }

    fn events_for(&mut self, events: Vec<StreamEvent>) -> Vec<NamedEvent> {
        let mut out = Vec::new();
        for event in events {
            match event {
                StreamEvent::Reasoning(t) => {
                    let index = self.ensure_block(
                        BlockKind::Thinking,
                        &mut out,
                        json!({"type": "thinking", "thinking": ""}),
                    );
                    out.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "thinking_delta", "thinking": t}}),
                    ));
                }
                StreamEvent::Content(t) => {
                    let index = self.ensure_block(
                        BlockKind::Text,
                        &mut out,
                        json!({"type": "text", "text": ""}),
                    );
                    out.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": t}}),
                    ));
                }
                StreamEvent::ToolCallStart { index, name } => {
                    if !self.parallel_tool_calls && index > 0 {
                        continue;
                    }
                    let id = self.tool_id(index);
                    self.ensure_block(
                        BlockKind::Tool(index),
                        &mut out,
                        json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    );
                }
                StreamEvent::ToolCallArguments {
                    index,
                    json_fragment,
                } => {
                    if let Some((block, BlockKind::Tool(open_call))) = self.open
                        && open_call == index
                    {
                        out.push((
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": block,
                            "delta": {"type": "input_json_delta", "partial_json": json_fragment}}),
                        ));
                    }
                }
                StreamEvent::ToolCallEnd { index } => {
                    if let Some((_, BlockKind::Tool(open_call))) = self.open
                        && open_call == index
                    {
                        self.close_block(&mut out);
                    }
                }
            }
        }
        out
    }

    pub fn push_text(&mut self, text: &str) -> Vec<NamedEvent> {
        let events = match self.parser.as_mut() {
            Some(p) => p.push(text),
            None => Vec::new(),
        };
        self.events_for(events)
    }

    fn finish_parser(&mut self, finish: &FinishReason) -> (Vec<NamedEvent>, ParsedOutput) {
        let (events, mut parsed) = match self.parser.take() {
            Some(p) => p.finish(*finish == FinishReason::Length),
            None => (Vec::new(), ParsedOutput::default()),
        };
        let mut out = self.events_for(events);
        self.close_block(&mut out);
        if !self.parallel_tool_calls {
            parsed.tool_calls.truncate(1);
        }
        (out, parsed)
    }

    fn usage(usage: &Usage) -> Value {
        json!({
            "input_tokens": usage.prompt_tokens - usage.cached_tokens,
            "output_tokens": usage.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens,
            "cache_creation_input_tokens": 0,
        })
    }

    fn stop_reason(finish: &FinishReason, has_tool_calls: bool) -> (&'static str, Value) {
        match finish {
            FinishReason::Length => ("max_tokens", Value::Null),
            FinishReason::StopString(s) => ("stop_sequence", json!(s)),
            _ if has_tool_calls => ("tool_use", Value::Null),
            _ => ("end_turn", Value::Null),
        }
    }

    /// The closing events: remaining blocks, `message_delta`, `message_stop`.
    pub fn finish_events(&mut self, output: &GenOutput) -> Vec<NamedEvent> {
        let (mut out, parsed) = self.finish_parser(&output.finish);
        let (reason, sequence) = Self::stop_reason(&output.finish, !parsed.tool_calls.is_empty());
        out.push((
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": Self::usage(&output.usage)}),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }

    /// The whole non-streaming message.
    pub fn into_response(mut self, output: &GenOutput) -> Value {
        let (_, parsed) = self.finish_parser(&output.finish);
        let mut content = Vec::new();
        if let Some(r) = parsed.reasoning.as_ref().filter(|r| !r.is_empty()) {
            content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
        }
        if !parsed.content.is_empty() {
            content.push(json!({"type": "text", "text": parsed.content}));
        }
        for (i, call) in parsed.tool_calls.iter().enumerate() {
            content.push(
                json!({"type": "tool_use", "id": self.tool_id(i), "name": call.name,
                                "input": Value::Object(call.arguments.clone())}),
            );
        }
        let (reason, sequence) = Self::stop_reason(&output.finish, !parsed.tool_calls.is_empty());
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": Self::usage(&output.usage),
        })
    }
}

fn to_sse(events: Vec<NamedEvent>) -> Vec<Event> {
    events
        .into_iter()
        .map(|(name, data)| Event::default().event(name).data(data.to_string()))
        .collect()
}

impl SseAssembler for MessageAssembler {
    fn start(&mut self) -> Vec<Event> {
        to_sse(self.start_events())
    }

    fn text(&mut self, text: &str) -> Vec<Event> {
        to_sse(self.push_text(text))
    }

    /// While a long prompt is processed: `ping` events, as Anthropic's API sends to keep
    /// clients waiting.
    fn progress(&mut self, progress: &super::openai::Progress) -> Vec<Event> {
        if progress.total - progress.cached <= crate::engine::generate::PREFILL_CHUNK {
            return Vec::new();
        }
        to_sse(vec![("ping", json!({"type": "ping"}))])
    }

    fn done(&mut self, result: Result<GenOutput, ApiError>) -> Vec<Event> {
        match result {
            Ok(output) => to_sse(self.finish_events(&output)),
            Err(e) => to_sse(vec![("error", e.with_flavor(FLAVOR).body())]),
        }
    }
}
