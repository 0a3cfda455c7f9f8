//! Splits model output into reasoning, answer text and tool calls, whole or as a stream.
//!
//! The model writes `<think>…</think>` reasoning (the generation prompt usually opens it, so the
//! output starts inside it) and then tool calls as
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
//! Models drift from that shape; the original server lost calls whenever they did (see
//! `docs/reference-system.md`, #210/#211 and the seed report), so this parser accepts the
//! near-misses seen in practice: JSON bodies, missing closing tags, `</parameter>` inside a
//! value, `<function name="x">`, zero-width spaces in tags, calls cut off by `max_tokens`.
//!
//! There is one implementation: [`StreamParser`] is a state machine over text deltas that only
//! commits what no later text can change, holding back anything that may still turn into a tag.
//! [`parse_output`] feeds it the whole text at once, so streamed and non-streamed answers agree
//! byte for byte.

use serde_json::{Map, Value};

use super::arguments::{ValueKind, convert_value, lenient_json};
use super::tags::{Scan, Tag, TagName, Want, close, is_blank, open, scan_tag};

/// A tool the client offered: its name and the JSON schema of its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Value,
}

impl ToolSpec {
    /// Reads an OpenAI tool (`{"type":"function","function":{"name":..,"parameters":..}}`), a bare
    /// function object, or an Anthropic tool (`{"name":..,"input_schema":..}`).
    pub fn from_tool_json(tool: &Value) -> Option<ToolSpec> {
        let function = tool.get("function").unwrap_or(tool);
        let name = function.get("name")?.as_str()?.to_string();
        let parameters = function
            .get("parameters")
            .or_else(|| function.get("input_schema"))
            .cloned()
            .unwrap_or(Value::Null);
        Some(ToolSpec { name, parameters })
    }

    /// [`ToolSpec::from_tool_json`] over a list, skipping entries without a name.
    pub fn list_from_tool_json(tools: &[Value]) -> Vec<ToolSpec> {
        tools.iter().filter_map(ToolSpec::from_tool_json).collect()
    }
}

/// The parsed answer. `content` never contains tool-call markup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedOutput {
    pub content: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ParsedToolCall>,
    /// The output ended (by `max_tokens`) inside a tool call; that call is not in `tool_calls`,
    /// because executing half a call (say, half a file write) is worse than not executing it.
    pub truncated_tool_call: bool,
    /// What had to be recovered or dropped (unknown tool, value not matching its schema, an
    /// unreadable call), for logs and client-visible diagnostics.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParsedToolCall {
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// One streaming increment, shaped for OpenAI `delta`s and Anthropic content-block events.
///
/// For each call, the `json_fragment`s of its `ToolCallArguments` concatenate to a JSON object
/// equal to the call's final arguments. A call cut off by `max_tokens` gets no `ToolCallEnd`.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Reasoning(String),
    Content(String),
    ToolCallStart { index: usize, name: String },
    ToolCallArguments { index: usize, json_fragment: String },
    ToolCallEnd { index: usize },
}

/// Parses a finished output that the model ended itself (stop token or stop string).
pub fn parse_output(text: &str, starts_in_reasoning: bool, tools: &[ToolSpec]) -> ParsedOutput {
    parse_finished_output(text, starts_in_reasoning, tools, false)
}

/// Parses a finished output; `stopped_by_length` says generation hit `max_tokens`, so an open
/// tool call is reported as truncated instead of being completed.
pub fn parse_finished_output(
    text: &str,
    starts_in_reasoning: bool,
    tools: &[ToolSpec],
    stopped_by_length: bool,
) -> ParsedOutput {
    let mut parser = StreamParser::new(starts_in_reasoning, tools.to_vec());
    parser.push(text);
    parser.finish(stopped_by_length).1
}

/// Whether generation after `prompt` starts inside a reasoning block, i.e. the rendered prompt
/// opened `<think>` without closing it (thinking on), as the Qwen3.8 generation prompt does.
pub fn prompt_starts_in_reasoning(prompt: &str) -> bool {
    match (prompt.rfind("<think>"), prompt.rfind("</think>")) {
        (Some(opened), Some(closed)) => opened > closed,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Incremental parser: [`StreamParser::push`] text deltas as they are decoded, then
/// [`StreamParser::finish`].
pub struct StreamParser {
    tools: Vec<ToolSpec>,
    starts_in_reasoning: bool,
    mode: Mode,
    /// Text received but not yet decided on.
    pending: String,
    reasoning: TrimmedChannel,
    content: TrimmedChannel,
    /// A `<think>` block was opened by the output itself.
    reasoning_opened_by_output: bool,
    /// The current call sits inside `<tool_call>` (as opposed to a bare `<function=…>`).
    in_call_block: bool,
    call: Option<OpenCall>,
    calls: Vec<ParsedToolCall>,
    warnings: Vec<String>,
    truncated: bool,
    /// Set by `finish`: generation hit `max_tokens`.
    stopped_by_length: bool,
}

enum Mode {
    /// Inside `<think>`: everything but `</think>` is reasoning, tool-call markup included.
    Reasoning,
    /// Answer text; watches for the start of a tool call.
    Content,
    /// After `<tool_call>`, before its body shows whether it is XML or JSON.
    CallOpen,
    /// A `<tool_call>` body that is not `<function=…>`: collected up to `</tool_call>`, then read
    /// as JSON (`{"name": .., "arguments": {..}}`).
    RawCall(String),
    /// Inside `<function=NAME>`, between parameters.
    Function,
    Parameter(ParameterState),
    /// After `</function>`, where `</tool_call>` should follow.
    AfterFunction,
}

struct ParameterState {
    name: String,
    kind: ValueKind,
    /// The value so far, after the format's leading newline.
    value: String,
    /// The leading newline (`<parameter=P>\n`) has been looked for.
    started: bool,
}

struct OpenCall {
    index: usize,
    name: String,
    arguments: Map<String, Value>,
    /// `{` and at least one key have been streamed.
    fragments_started: bool,
    /// Text inside `<function>` that is not a parameter (some models put a JSON object there).
    loose_text: String,
}

/// Tags that end a parameter value when the model forgot `</parameter>`, and what may follow
/// a real `</parameter>`.
const AFTER_PARAMETER: [Want; 5] = [
    open(TagName::Parameter),
    close(TagName::Function),
    close(TagName::ToolCall),
    open(TagName::ToolCall),
    open(TagName::Function),
];
const AFTER_FUNCTION: [Want; 3] = [
    close(TagName::ToolCall),
    open(TagName::ToolCall),
    open(TagName::Function),
];
const AFTER_CALL_BLOCK: [Want; 1] = [open(TagName::ToolCall)];

/// Outcome of checking whether a closing tag inside a value really closes it.
enum Plausible {
    Yes,
    No,
    NeedMore,
}

impl StreamParser {
    pub fn new(starts_in_reasoning: bool, tools: Vec<ToolSpec>) -> Self {
        StreamParser {
            tools,
            starts_in_reasoning,
            mode: if starts_in_reasoning {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            pending: String::new(),
            reasoning: TrimmedChannel::default(),
            content: TrimmedChannel::default(),
            reasoning_opened_by_output: false,
            in_call_block: false,
            call: None,
            calls: Vec::new(),
            warnings: Vec::new(),
            truncated: false,
            stopped_by_length: false,
        }
    }

    pub fn push(&mut self, delta: &str) -> Vec<StreamEvent> {
        self.pending.push_str(delta);
        let mut events = Vec::new();
        self.process(false, &mut events);
        events
    }

    /// Ends the stream. Returns the last events and the whole parsed output.
    pub fn finish(mut self, stopped_by_length: bool) -> (Vec<StreamEvent>, ParsedOutput) {
        let mut events = Vec::new();
        self.stopped_by_length = stopped_by_length;
        self.process(true, &mut events);
        let mode = std::mem::replace(&mut self.mode, Mode::Content);
        match mode {
            Mode::Reasoning => {
                if !stopped_by_length {
                    self.recover_calls_from_unclosed_reasoning(&mut events);
                }
            }
            Mode::Content | Mode::AfterFunction => {}
            Mode::CallOpen => {
                if stopped_by_length {
                    self.truncated = true;
                } else {
                    self.warnings
                        .push("output ended right after <tool_call>".to_string());
                }
            }
            Mode::RawCall(text) => {
                if !self.finish_raw_call(&text, &mut events) && stopped_by_length {
                    self.truncated = true;
                }
            }
            Mode::Function => {
                if stopped_by_length {
                    self.drop_truncated_call();
                } else {
                    self.end_call(&mut events);
                }
            }
            Mode::Parameter(parameter) => {
                if stopped_by_length {
                    self.drop_truncated_call();
                } else {
                    self.finish_parameter(parameter, &mut events);
                    self.end_call(&mut events);
                }
            }
        }
        let reasoning = (!self.reasoning.text.is_empty()).then(|| self.reasoning.text.clone());
        let output = ParsedOutput {
            content: std::mem::take(&mut self.content.text),
            reasoning,
            tool_calls: std::mem::take(&mut self.calls),
            truncated_tool_call: self.truncated,
            warnings: std::mem::take(&mut self.warnings),
        };
        (events, output)
    }

    /// The model ended its turn while still inside `<think>`, and the reasoning ends with
    /// complete tool calls: it forgot `</think>`. Those calls were streamed as reasoning text;
    /// rather than lose them, they are reported as calls now (events included) and cut from
    /// the final reasoning. Calls followed by more prose stay reasoning: that is thinking
    /// about a call, not making one.
    fn recover_calls_from_unclosed_reasoning(&mut self, events: &mut Vec<StreamEvent>) {
        let raw = format!("{}{}", self.reasoning.text, self.reasoning.pending_blank);
        let wanted = [open(TagName::ToolCall), open(TagName::Function)];
        let Some(start) = raw
            .match_indices('<')
            .map(|(i, _)| i)
            .find(|&i| matches!(scan_tag(&raw[i..], true, &wanted), Scan::Tag(_)))
        else {
            return;
        };
        let mut tail = StreamParser::new(false, self.tools.clone());
        let mut tail_events = tail.push(&raw[start..]);
        let (final_events, tail_output) = tail.finish(false);
        tail_events.extend(final_events);
        if tail_output.tool_calls.is_empty() || !tail_output.content.is_empty() {
            return;
        }
        self.warnings.push(format!(
            "{} tool call(s) written inside unclosed <think> were recovered",
            tail_output.tool_calls.len()
        ));
        self.warnings.extend(tail_output.warnings);
        self.reasoning.text = raw[..start].trim_end().to_string();
        self.reasoning.pending_blank.clear();
        self.calls = tail_output.tool_calls;
        events.extend(tail_events);
    }

    fn drop_truncated_call(&mut self) {
        self.truncated = true;
        if let Some(call) = self.call.take() {
            self.warnings.push(format!(
                "tool call {:?} was cut off by max_tokens and dropped",
                call.name
            ));
        }
    }

    /// Consumes as much of `pending` as can be decided; at `eof` everything is decided.
    fn process(&mut self, eof: bool, events: &mut Vec<StreamEvent>) {
        let text = std::mem::take(&mut self.pending);
        let mut pos = 0;
        while pos <= text.len() {
            let mode = std::mem::replace(&mut self.mode, Mode::Content);
            let (next_mode, consumed) = self.step(mode, &text[pos..], eof, events);
            self.mode = next_mode;
            match consumed {
                Some(n) => pos += n,
                None => break,
            }
        }
        self.pending = text[pos.min(text.len())..].to_string();
    }

    /// One decision. Returns the next mode and the bytes consumed, or `None` to wait for more
    /// text. A step that consumes nothing always changes the mode, so the loop ends.
    fn step(
        &mut self,
        mode: Mode,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        match mode {
            Mode::Reasoning => self.step_reasoning(rest, eof, events),
            Mode::Content => self.step_content(rest, eof, events),
            Mode::CallOpen => self.step_call_open(rest, eof, events),
            Mode::RawCall(body) => self.step_raw_call(body, rest, eof, events),
            Mode::Function => self.step_function(rest, eof, events),
            Mode::Parameter(parameter) => self.step_parameter(parameter, rest, eof, events),
            Mode::AfterFunction => self.step_after_function(rest, eof, events),
        }
    }

    fn step_reasoning(
        &mut self,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        if rest.is_empty() {
            return (Mode::Reasoning, None);
        }
        let lt = rest.find('<').unwrap_or(rest.len());
        if lt > 0 {
            self.emit_reasoning(&rest[..lt], events);
            return (Mode::Reasoning, Some(lt));
        }
        // A repeated `<think>` before any reasoning text is the model re-opening the block.
        let wanted: &[Want] = if self.reasoning.text.is_empty() {
            &[close(TagName::Think), open(TagName::Think)]
        } else {
            &[close(TagName::Think)]
        };
        match scan_tag(rest, eof, wanted) {
            Scan::NeedMore => (Mode::Reasoning, None),
            Scan::NotATag => {
                self.emit_reasoning("<", events);
                (Mode::Reasoning, Some(1))
            }
            Scan::Tag(tag) if tag.closing => (Mode::Content, Some(tag.len)),
            Scan::Tag(tag) => (Mode::Reasoning, Some(tag.len)),
        }
    }

    fn step_content(
        &mut self,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        if rest.is_empty() {
            return (Mode::Content, None);
        }
        let lt = rest.find('<').unwrap_or(rest.len());
        if lt > 0 {
            self.emit_content(&rest[..lt], events);
            return (Mode::Content, Some(lt));
        }
        let mut wanted = vec![
            open(TagName::ToolCall),
            open(TagName::Function),
            // Stray closing tags are markup too and never reach the answer text.
            close(TagName::ToolCall),
            close(TagName::Function),
            close(TagName::Parameter),
            close(TagName::Think),
            // A parameter outside any function: a call missing its `<function=…>` line.
            open(TagName::Parameter),
        ];
        let may_open_reasoning = !self.starts_in_reasoning
            && !self.reasoning_opened_by_output
            && self.content.text.is_empty()
            && self.calls.is_empty();
        if may_open_reasoning {
            wanted.push(open(TagName::Think));
        }
        match scan_tag(rest, eof, &wanted) {
            Scan::NeedMore => (Mode::Content, None),
            Scan::NotATag => {
                // At the end of the output, the start of a tag that never finished is dropped
                // rather than shown (`<tool_ca` cut off by max_tokens); a lone `<` stays text.
                if eof && rest.len() >= 3 && scan_tag(rest, false, &wanted) == Scan::NeedMore {
                    if self.stopped_by_length {
                        self.truncated = true;
                    }
                    return (Mode::Content, Some(rest.len()));
                }
                self.emit_content("<", events);
                (Mode::Content, Some(1))
            }
            Scan::Tag(tag) => {
                let len = Some(tag.len);
                match (tag.name, tag.closing) {
                    (TagName::ToolCall, false) => {
                        self.content.drop_pending_blank();
                        self.in_call_block = true;
                        (Mode::CallOpen, len)
                    }
                    (TagName::Function, false) => {
                        self.content.drop_pending_blank();
                        self.in_call_block = false;
                        self.start_call(tag, events);
                        (Mode::Function, len)
                    }
                    (TagName::Think, false) => {
                        self.reasoning_opened_by_output = true;
                        (Mode::Reasoning, len)
                    }
                    (TagName::Parameter, false) => {
                        // Collected like a `<tool_call>` body; the tool is inferred at the end.
                        self.content.drop_pending_blank();
                        self.in_call_block = true;
                        (Mode::RawCall(rest[..tag.len].to_string()), len)
                    }
                    _ => (Mode::Content, len),
                }
            }
        }
    }

    fn step_call_open(
        &mut self,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        let blank = leading_blank_len(rest);
        if blank > 0 {
            return (Mode::CallOpen, Some(blank));
        }
        if rest.is_empty() {
            return (Mode::CallOpen, None);
        }
        let wanted = [
            open(TagName::Function),
            close(TagName::ToolCall),
            open(TagName::ToolCall),
        ];
        if !rest.starts_with('<') {
            return (Mode::RawCall(String::new()), Some(0));
        }
        match scan_tag(rest, eof, &wanted) {
            Scan::NeedMore => (Mode::CallOpen, None),
            Scan::NotATag => (Mode::RawCall(String::new()), Some(0)),
            Scan::Tag(tag) => {
                let len = Some(tag.len);
                match (tag.name, tag.closing) {
                    (TagName::Function, _) => {
                        self.start_call(tag, events);
                        (Mode::Function, len)
                    }
                    (TagName::ToolCall, true) => {
                        self.warnings.push("empty <tool_call> block".to_string());
                        self.in_call_block = false;
                        (Mode::Content, len)
                    }
                    // A doubled `<tool_call>`.
                    _ => (Mode::CallOpen, len),
                }
            }
        }
    }

    fn step_raw_call(
        &mut self,
        mut body: String,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        if rest.is_empty() {
            return (Mode::RawCall(body), None);
        }
        let lt = rest.find('<').unwrap_or(rest.len());
        if lt > 0 {
            body.push_str(&rest[..lt]);
            return (Mode::RawCall(body), Some(lt));
        }
        let wanted = [close(TagName::ToolCall), open(TagName::ToolCall)];
        match scan_tag(rest, eof, &wanted) {
            Scan::NeedMore => (Mode::RawCall(body), None),
            Scan::NotATag => {
                body.push('<');
                (Mode::RawCall(body), Some(1))
            }
            Scan::Tag(tag) => {
                self.finish_raw_call(&body, events);
                if tag.closing {
                    self.in_call_block = false;
                    (Mode::Content, Some(tag.len))
                } else {
                    (Mode::CallOpen, Some(tag.len))
                }
            }
        }
    }

    fn step_function(
        &mut self,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        let has_loose_text = self.call.as_ref().is_some_and(|c| !c.loose_text.is_empty());
        let blank = leading_blank_len(rest);
        if blank > 0 && !has_loose_text {
            return (Mode::Function, Some(blank));
        }
        if rest.is_empty() {
            return (Mode::Function, None);
        }
        let lt = rest.find('<').unwrap_or(rest.len());
        if lt > 0 {
            self.push_loose_text(&rest[..lt]);
            return (Mode::Function, Some(lt));
        }
        let wanted = [
            open(TagName::Parameter),
            close(TagName::Function),
            close(TagName::ToolCall),
            open(TagName::Function),
            open(TagName::ToolCall),
            close(TagName::Parameter),
        ];
        match scan_tag(rest, eof, &wanted) {
            Scan::NeedMore => (Mode::Function, None),
            Scan::NotATag => {
                self.push_loose_text("<");
                (Mode::Function, Some(1))
            }
            Scan::Tag(tag) => {
                let len = Some(tag.len);
                match (tag.name, tag.closing) {
                    (TagName::Parameter, false) => {
                        let parameter = self.start_parameter(tag, events);
                        (Mode::Parameter(parameter), len)
                    }
                    // A stray `</parameter>` between parameters.
                    (TagName::Parameter, true) => (Mode::Function, len),
                    (TagName::Function, true) => {
                        self.end_call(events);
                        (self.mode_after_function(), len)
                    }
                    (TagName::ToolCall, true) => {
                        self.end_call(events);
                        self.in_call_block = false;
                        (Mode::Content, len)
                    }
                    (TagName::Function, false) => {
                        self.end_call(events);
                        self.start_call(tag, events);
                        (Mode::Function, len)
                    }
                    _ => {
                        self.end_call(events);
                        self.in_call_block = true;
                        (Mode::CallOpen, len)
                    }
                }
            }
        }
    }

    fn step_parameter(
        &mut self,
        mut parameter: ParameterState,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        if !parameter.started {
            // The format puts the value on its own line: drop exactly that one newline.
            let newline = if rest.starts_with("\r\n") {
                2
            } else if rest.starts_with('\n') {
                1
            } else if rest.is_empty() || rest == "\r" {
                return (Mode::Parameter(parameter), None);
            } else {
                0
            };
            parameter.started = true;
            return (Mode::Parameter(parameter), Some(newline));
        }
        if rest.is_empty() {
            return (Mode::Parameter(parameter), None);
        }
        let lt = rest.find('<').unwrap_or(rest.len());
        if lt > 0 {
            self.push_value(&mut parameter, &rest[..lt], events);
            return (Mode::Parameter(parameter), Some(lt));
        }
        let wanted = [
            close(TagName::Parameter),
            close(TagName::Function),
            close(TagName::ToolCall),
            open(TagName::Parameter),
        ];
        let tag = match scan_tag(rest, eof, &wanted) {
            Scan::NeedMore => return (Mode::Parameter(parameter), None),
            Scan::NotATag => None,
            Scan::Tag(tag) => Some(tag),
        };
        let Some(tag) = tag else {
            self.push_value(&mut parameter, "<", events);
            return (Mode::Parameter(parameter), Some(1));
        };
        // A closing tag inside a value (code, XML, this very format) is only the end of the
        // value when what follows it is the format's next step; otherwise it is value text.
        let after = &rest[tag.len..];
        let plausible = match (tag.name, tag.closing) {
            (TagName::Parameter, true) => followed_by(after, eof, &AFTER_PARAMETER),
            (TagName::Function, true) => followed_by(after, eof, &AFTER_FUNCTION),
            (TagName::ToolCall, true) => followed_by(after, eof, &AFTER_CALL_BLOCK),
            // `</parameter>` forgotten: a new parameter on its own line ends this one.
            _ => {
                if parameter.value.is_empty() || parameter.value.ends_with('\n') {
                    Plausible::Yes
                } else {
                    Plausible::No
                }
            }
        };
        match plausible {
            Plausible::NeedMore => (Mode::Parameter(parameter), None),
            Plausible::No => {
                self.push_value(&mut parameter, "<", events);
                (Mode::Parameter(parameter), Some(1))
            }
            Plausible::Yes => {
                self.finish_parameter(parameter, events);
                let len = Some(tag.len);
                match (tag.name, tag.closing) {
                    (TagName::Parameter, true) => (Mode::Function, len),
                    (TagName::Function, _) => {
                        self.end_call(events);
                        (self.mode_after_function(), len)
                    }
                    (TagName::ToolCall, _) => {
                        self.end_call(events);
                        self.in_call_block = false;
                        (Mode::Content, len)
                    }
                    _ => {
                        let next = self.start_parameter(tag, events);
                        (Mode::Parameter(next), len)
                    }
                }
            }
        }
    }

    fn step_after_function(
        &mut self,
        rest: &str,
        eof: bool,
        events: &mut Vec<StreamEvent>,
    ) -> (Mode, Option<usize>) {
        let blank = leading_blank_len(rest);
        if blank > 0 {
            return (Mode::AfterFunction, Some(blank));
        }
        if rest.is_empty() {
            return (Mode::AfterFunction, None);
        }
        if !rest.starts_with('<') {
            // Prose after the calls: keep it as answer text.
            self.in_call_block = false;
            return (Mode::Content, Some(0));
        }
        let wanted = [
            close(TagName::ToolCall),
            open(TagName::ToolCall),
            open(TagName::Function),
            close(TagName::Function),
        ];
        match scan_tag(rest, eof, &wanted) {
            Scan::NeedMore => (Mode::AfterFunction, None),
            Scan::NotATag => {
                self.in_call_block = false;
                (Mode::Content, Some(0))
            }
            Scan::Tag(tag) => {
                let len = Some(tag.len);
                match (tag.name, tag.closing) {
                    (TagName::ToolCall, true) => {
                        self.in_call_block = false;
                        (Mode::Content, len)
                    }
                    (TagName::ToolCall, false) => (Mode::CallOpen, len),
                    (TagName::Function, false) => {
                        // Two functions in one `<tool_call>` block: two calls.
                        self.start_call(tag, events);
                        (Mode::Function, len)
                    }
                    _ => (Mode::AfterFunction, len),
                }
            }
        }
    }

    fn mode_after_function(&self) -> Mode {
        if self.in_call_block {
            Mode::AfterFunction
        } else {
            Mode::Content
        }
    }

    fn emit_reasoning(&mut self, text: &str, events: &mut Vec<StreamEvent>) {
        if let Some(delta) = self.reasoning.push(text) {
            events.push(StreamEvent::Reasoning(delta));
        }
    }

    fn emit_content(&mut self, text: &str, events: &mut Vec<StreamEvent>) {
        if let Some(delta) = self.content.push(text) {
            events.push(StreamEvent::Content(delta));
        }
    }

    fn start_call(&mut self, tag: Tag, events: &mut Vec<StreamEvent>) {
        let name = tag.attr.unwrap_or_default();
        self.open_call(name, events);
    }

    fn open_call(&mut self, name: String, events: &mut Vec<StreamEvent>) {
        let index = self.calls.len();
        if !self.tools.iter().any(|t| t.name == name) {
            self.warnings.push(format!(
                "model called {name:?}, which is not an offered tool"
            ));
        }
        events.push(StreamEvent::ToolCallStart {
            index,
            name: name.clone(),
        });
        self.call = Some(OpenCall {
            index,
            name,
            arguments: Map::new(),
            fragments_started: false,
            loose_text: String::new(),
        });
    }

    fn push_loose_text(&mut self, text: &str) {
        if let Some(call) = self.call.as_mut() {
            call.loose_text.push_str(text);
        }
    }

    fn start_parameter(&mut self, tag: Tag, events: &mut Vec<StreamEvent>) -> ParameterState {
        let name = tag.attr.unwrap_or_default();
        let schema = self.call.as_ref().and_then(|call| {
            self.tools
                .iter()
                .find(|t| t.name == call.name)
                .map(|t| &t.parameters)
        });
        let kind = ValueKind::for_parameter(schema, &name);
        if kind == ValueKind::Text {
            // Text values stream as they arrive: open the JSON string now.
            if let Some(call) = self.call.as_mut() {
                let fragment = format!("{}\"", key_fragment(call, &name));
                events.push(StreamEvent::ToolCallArguments {
                    index: call.index,
                    json_fragment: fragment,
                });
            }
        }
        ParameterState {
            name,
            kind,
            value: String::new(),
            started: false,
        }
    }

    fn push_value(
        &mut self,
        parameter: &mut ParameterState,
        text: &str,
        events: &mut Vec<StreamEvent>,
    ) {
        if parameter.kind == ValueKind::Text {
            // The newline before `</parameter>` belongs to the format, so the last newline seen
            // is held back until more value text shows it was part of the value.
            let held_before = parameter.value.ends_with('\n');
            let mut fresh = String::with_capacity(text.len() + 1);
            if held_before {
                fresh.push('\n');
            }
            fresh.push_str(text);
            if fresh.ends_with('\n') {
                fresh.pop();
            }
            if let Some(call) = self.call.as_ref()
                && !fresh.is_empty()
            {
                events.push(StreamEvent::ToolCallArguments {
                    index: call.index,
                    json_fragment: json_string_body(&fresh),
                });
            }
        }
        parameter.value.push_str(text);
    }

    fn finish_parameter(&mut self, parameter: ParameterState, events: &mut Vec<StreamEvent>) {
        let ParameterState {
            name, kind, value, ..
        } = parameter;
        let text = value.strip_suffix('\n').unwrap_or(&value);
        let text = text.strip_suffix('\r').unwrap_or(text);
        let (converted, note) = convert_value(text, &kind);
        let Some(call) = self.call.as_mut() else {
            return;
        };
        if let Some(note) = note {
            self.warnings
                .push(format!("{}.{}: {note}", call.name, name));
        }
        let fragment = if kind == ValueKind::Text {
            "\"".to_string()
        } else {
            let key = key_fragment(call, &name);
            format!("{key}{}", json_text(&converted))
        };
        events.push(StreamEvent::ToolCallArguments {
            index: call.index,
            json_fragment: fragment,
        });
        call.arguments.insert(name, converted);
    }

    fn end_call(&mut self, events: &mut Vec<StreamEvent>) {
        let Some(mut call) = self.call.take() else {
            return;
        };
        let loose = call.loose_text.trim();
        let mut closing = if call.fragments_started { "}" } else { "{}" }.to_string();
        if !loose.is_empty() {
            // `<function=f>{"a": 1}</function>`: arguments as a JSON object instead of parameters.
            match lenient_json(loose) {
                Some(Value::Object(object)) if !call.fragments_started => {
                    closing = json_text(&Value::Object(object.clone()));
                    call.arguments = object;
                }
                _ => self.warnings.push(format!(
                    "ignored text inside <function={}>: {:?}",
                    call.name,
                    abbreviate(loose)
                )),
            }
        }
        events.push(StreamEvent::ToolCallArguments {
            index: call.index,
            json_fragment: closing,
        });
        events.push(StreamEvent::ToolCallEnd { index: call.index });
        self.calls.push(ParsedToolCall {
            name: call.name,
            arguments: call.arguments,
        });
    }

    /// Reads a `<tool_call>` body written as JSON. Returns whether it produced a call.
    fn finish_raw_call(&mut self, body: &str, events: &mut Vec<StreamEvent>) -> bool {
        let parsed = json_call(body).or_else(|| {
            let inferred = call_without_function_tag(body, &self.tools);
            if let Some((name, _)) = &inferred {
                self.warnings.push(format!(
                    "<tool_call> without <function=...>: {name:?} inferred from its parameters"
                ));
            }
            inferred
        });
        let Some((name, arguments)) = parsed else {
            if !body.trim().is_empty() {
                self.warnings.push(format!(
                    "unreadable tool call dropped: {:?}",
                    abbreviate(body.trim())
                ));
            }
            return false;
        };
        self.open_call(name, events);
        if let Some(call) = self.call.as_mut() {
            call.arguments = arguments;
            events.push(StreamEvent::ToolCallArguments {
                index: call.index,
                json_fragment: json_text(&Value::Object(call.arguments.clone())),
            });
            events.push(StreamEvent::ToolCallEnd { index: call.index });
        }
        if let Some(call) = self.call.take() {
            self.calls.push(ParsedToolCall {
                name: call.name,
                arguments: call.arguments,
            });
        }
        true
    }
}

/// Reads a `<tool_call>` that has `<parameter=…>`s but no `<function=…>`: the tool is the one
/// offered tool whose schema has every parameter used, if exactly one has.
fn call_without_function_tag(
    body: &str,
    tools: &[ToolSpec],
) -> Option<(String, Map<String, Value>)> {
    if !body.trim_start().starts_with("<parameter") {
        return None;
    }
    let parse_with_name = |name: &str| {
        let mut parser = StreamParser::new(false, tools.to_vec());
        parser.push(&format!("<function={name}>\n"));
        parser.push(body);
        parser.push("\n</function>");
        parser.finish(false).1.tool_calls.into_iter().next()
    };
    let probe = parse_with_name("_")?;
    if probe.arguments.is_empty() {
        return None;
    }
    let mut candidates = tools.iter().filter(|tool| {
        probe.arguments.keys().all(|key| {
            tool.parameters
                .get("properties")
                .and_then(|properties| properties.get(key.as_str()))
                .is_some()
        })
    });
    let tool = candidates.next()?;
    if candidates.next().is_some() {
        return None;
    }
    let call = parse_with_name(&tool.name)?;
    Some((call.name, call.arguments))
}

/// Reads `{"name": .., "arguments": {..}}` (also `parameters`, string-encoded arguments, and an
/// OpenAI-style `{"function": {..}}` wrapper).
fn json_call(body: &str) -> Option<(String, Map<String, Value>)> {
    let value = lenient_json(body)?;
    let object = value.as_object()?;
    let object = match object.get("function") {
        Some(Value::Object(inner)) if !object.contains_key("name") => inner,
        _ => object,
    };
    let name = object.get("name")?.as_str()?.trim().to_string();
    if name.is_empty() {
        return None;
    }
    let arguments = ["arguments", "parameters", "args", "input"]
        .iter()
        .find_map(|key| object.get(*key));
    let arguments = match arguments {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(Value::String(encoded)) => match lenient_json(encoded) {
            Some(Value::Object(map)) => map,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some((name, arguments))
}

/// Whether the text after a closing tag continues the way the format does.
fn followed_by(after: &str, eof: bool, wanted: &[Want]) -> Plausible {
    let next = &after[leading_blank_len(after)..];
    if next.is_empty() {
        return if eof {
            Plausible::Yes
        } else {
            Plausible::NeedMore
        };
    }
    if !next.starts_with('<') {
        return Plausible::No;
    }
    match scan_tag(next, eof, wanted) {
        Scan::Tag(_) => Plausible::Yes,
        Scan::NeedMore => Plausible::NeedMore,
        Scan::NotATag => Plausible::No,
    }
}

fn leading_blank_len(text: &str) -> usize {
    text.len() - text.trim_start_matches(is_blank).len()
}

/// `{"key": ` for the first argument of a call, `, "key": ` for the others.
fn key_fragment(call: &mut OpenCall, key: &str) -> String {
    let separator = if call.fragments_started { ", " } else { "{" };
    call.fragments_started = true;
    format!(
        "{separator}{}: ",
        json_text(&Value::String(key.to_string()))
    )
}

fn json_text(value: &Value) -> String {
    // Serialising a `serde_json::Value` cannot fail (its map keys are strings).
    serde_json::to_string(value).unwrap_or_default()
}

/// The escaped inside of a JSON string literal, so that pieces can be streamed one by one.
fn json_string_body(text: &str) -> String {
    let quoted = json_text(&Value::String(text.to_string()));
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .to_string()
}

fn abbreviate(text: &str) -> String {
    const LIMIT: usize = 200;
    match text.char_indices().nth(LIMIT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Text that reaches the client trimmed at both ends without ever being retracted: leading
/// whitespace is dropped, trailing whitespace is held back until more text follows it.
#[derive(Default)]
struct TrimmedChannel {
    text: String,
    pending_blank: String,
}

impl TrimmedChannel {
    fn push(&mut self, piece: &str) -> Option<String> {
        let piece = if self.text.is_empty() {
            piece.trim_start()
        } else {
            piece
        };
        let body = piece.trim_end();
        if body.is_empty() {
            if !self.text.is_empty() {
                self.pending_blank.push_str(piece);
            }
            return None;
        }
        let mut delta = std::mem::take(&mut self.pending_blank);
        delta.push_str(body);
        self.pending_blank = piece[body.len()..].to_string();
        self.text.push_str(&delta);
        Some(delta)
    }

    /// The blank before a tool call separates prose from markup; it is not part of the answer.
    fn drop_pending_blank(&mut self) {
        self.pending_blank.clear();
    }
}
