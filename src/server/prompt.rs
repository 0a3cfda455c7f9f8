//! What both APIs share once their request is normalised: messages + tool offer + reasoning
//! options → rendered prompt → token ids, and the tool-call output parser's inputs.

use serde_json::{Map, Value};

use super::{ApiError, Flavor, LoadedModel};
use crate::chat::toolcall::ToolSpec;
use crate::chat::{Message, RenderOptions};

/// How the client wants tools used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (default).
    Auto,
    /// Tools are not offered.
    None,
    /// The model is told it must call one of the tools.
    Required,
    /// Only this tool is offered, and the model is told to call it.
    Named(String),
}

/// Instruction added to the system turn when the client requires a tool call.
const REQUIRED_TOOL_INSTRUCTION: &str =
    "You must answer this turn by calling one or more of the functions above.";

/// A normalised chat request, independent of the API it came through.
#[derive(Debug, Clone, Default)]
pub struct ChatPrompt {
    pub messages: Vec<Message>,
    /// Tools in OpenAI form (`{"type":"function","function":{name, description, parameters}}`).
    pub tools: Vec<Value>,
    pub tool_choice: Option<ToolChoice>,
    pub enable_thinking: Option<bool>,
    pub reasoning_effort: Option<String>,
    /// Extra template variables (`chat_template_kwargs`).
    pub extra: Map<String, Value>,
    /// Text the answer must start with (Anthropic's trailing assistant message): appended after
    /// the generation prompt, and the model continues from it.
    pub assistant_prefill: Option<String>,
}

/// The result of rendering: what to feed and how to read the output.
#[derive(Debug, Clone)]
pub struct PreparedPrompt {
    pub ids: Vec<u32>,
    /// The rendered prompt ends inside an open `<think>` block.
    pub starts_in_reasoning: bool,
    /// Tools the output parser accepts calls for (empty when tools are not offered).
    pub tool_specs: Vec<ToolSpec>,
    /// The client required a tool call.
    pub tool_call_required: bool,
    /// Where the generation prompt starts (a prompt-cache checkpoint for the next turn).
    pub checkpoint: Option<usize>,
}

/// Map an API's reasoning effort onto the template's (`low`, `medium`, `xhigh`). `none` and
/// `minimal` turn thinking off. Returns (enable_thinking, effort).
pub fn map_reasoning_effort(effort: &str) -> Result<(Option<bool>, Option<String>), String> {
    match effort.trim().to_ascii_lowercase().as_str() {
        "none" | "minimal" | "off" => Ok((Some(false), None)),
        "low" => Ok((Some(true), Some("low".into()))),
        "medium" => Ok((Some(true), Some("medium".into()))),
        "high" | "xhigh" | "max" => Ok((Some(true), Some("xhigh".into()))),
        other => Err(format!(
            "unknown reasoning_effort {other:?}; use none, minimal, low, medium or high"
        )),
    }
}

/// The name of an OpenAI-form tool (`{"type":"function","function":{"name":..}}` or `{"name":..}`).
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")
        .unwrap_or(tool)
        .get("name")
        .and_then(Value::as_str)
}

/// Check the tools array and return the parser's view of it.
pub fn tool_specs(tools: &[Value], flavor: Flavor) -> Result<Vec<ToolSpec>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let function = tool.get("function").unwrap_or(tool);
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        &format!("tools[{i}]"),
                        format!("tools[{i}] has no function name"),
                    )
                    .with_flavor(flavor)
                })?;
            let parameters = function
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
            Ok(ToolSpec {
                name: name.to_string(),
                parameters,
            })
        })
        .collect()
}

/// Render the conversation with the model's template and tokenize it.
pub fn prepare_chat(
    model: &LoadedModel,
    mut prompt: ChatPrompt,
    flavor: Flavor,
) -> Result<PreparedPrompt, ApiError> {
    let template = model.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions with a raw prompt",
        )
        .with_flavor(flavor)
    })?;
    if prompt.messages.is_empty() {
        return Err(
            ApiError::invalid_param("messages", "messages must not be empty").with_flavor(flavor),
        );
    }
    prompt.tools = decode_double_encoded_tools(std::mem::take(&mut prompt.tools), flavor)?;
    let choice = prompt.tool_choice.clone().unwrap_or(ToolChoice::Auto);
    let offered: Vec<Value> = match &choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Auto | ToolChoice::Required => prompt.tools.clone(),
        ToolChoice::Named(name) => {
            let only: Vec<Value> = prompt
                .tools
                .iter()
                .filter(|t| tool_name(t) == Some(name.as_str()))
                .cloned()
                .collect();
            if only.is_empty() {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("tool_choice names {name:?}, which is not among the tools offered"),
                )
                .with_flavor(flavor));
            }
            only
        }
    };
    let tool_call_required =
        !offered.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
    if matches!(choice, ToolChoice::Required) && offered.is_empty() {
        return Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice requires a tool call but no tools were given",
        )
        .with_flavor(flavor));
    }
    let specs = tool_specs(&offered, flavor)?;
    if tool_call_required {
        let instruction = match &choice {
            ToolChoice::Named(name) => {
                format!("You must answer this turn by calling the function {name}.")
            }
            _ => REQUIRED_TOOL_INSTRUCTION.to_string(),
        };
        add_system_instruction(&mut prompt.messages, &instruction);
    }
    let options = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: prompt.enable_thinking,
        reasoning_effort: prompt.reasoning_effort.clone(),
        tools: if offered.is_empty() {
            None
        } else {
            Some(offered)
        },
        extra: prompt.extra.clone(),
    };
    let mut text = template.render(&prompt.messages, &options).map_err(|e| {
        ApiError::bad_request(format!("the chat template refused this conversation: {e}"))
            .with_flavor(flavor)
    })?;
    if let Some(prefill) = &prompt.assistant_prefill {
        text.push_str(prefill);
    }
    let ids = model.tokenizer.encode(&text, true).map_err(|e| {
        ApiError::bad_request(format!("cannot tokenize the prompt: {e}")).with_flavor(flavor)
    })?;
    let checkpoint =
        generation_prompt_start(template, &prompt.messages, &options, &model.tokenizer, &ids);
    Ok(PreparedPrompt {
        checkpoint,
        ids,
        starts_in_reasoning: crate::chat::prompt_starts_in_reasoning(&text),
        tool_specs: specs,
        tool_call_required,
    })
}

/// Token count of the conversation without the generation prompt, when it is a strict prefix of
/// `ids` (the next turn re-renders this turn's answer, so only the part before can be reused).
pub fn generation_prompt_start(
    template: &crate::chat::ChatTemplate,
    messages: &[Message],
    options: &RenderOptions,
    tokenizer: &crate::tokenizer::Tokenizer,
    ids: &[u32],
) -> Option<usize> {
    let without = RenderOptions {
        add_generation_prompt: false,
        ..options.clone()
    };
    let text = template.render(messages, &without).ok()?;
    let prefix = tokenizer.encode(&text, true).ok()?;
    (prefix.len() < ids.len() && ids.starts_with(&prefix)).then_some(prefix.len())
}

/// Some clients send each tool as a JSON string of the tool object; decode those.
fn decode_double_encoded_tools(tools: Vec<Value>, flavor: Flavor) -> Result<Vec<Value>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, tool)| match tool {
            Value::String(s) => match serde_json::from_str::<Value>(&s) {
                Ok(v @ Value::Object(_)) => Ok(v),
                _ => Err(ApiError::invalid_param(
                    &format!("tools[{i}]"),
                    format!("tools[{i}] must be a tool object"),
                )
                .with_flavor(flavor)),
            },
            Value::Object(_) => Ok(tool),
            _ => Err(ApiError::invalid_param(
                &format!("tools[{i}]"),
                format!("tools[{i}] must be a tool object"),
            )
            .with_flavor(flavor)),
        })
        .collect()
}

fn add_system_instruction(messages: &mut Vec<Message>, instruction: &str) {
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            let existing = first.content.take().unwrap_or_default();
            first.content = Some(if existing.trim().is_empty() {
                instruction.to_string()
            } else {
                format!("{existing}\n\n{instruction}")
            });
        }
        _ => messages.insert(
            0,
            Message {
                role: "system".into(),
                content: Some(instruction.to_string()),
                ..Message::default()
            },
        ),
    }
}

/// Leading system messages merge into one; a system message after the conversation started
/// becomes a user message (the template only accepts a system turn first), and empty assistant
/// turns are dropped (they teach the model to answer with nothing).
pub fn normalise_roles(messages: Vec<Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for m in messages {
        if m.role == "system" {
            let only_system_so_far = out.len() == 1;
            match out.last_mut() {
                Some(prev) if prev.role == "system" && only_system_so_far => {
                    let a = prev.content.take().unwrap_or_default();
                    let b = m.content.unwrap_or_default();
                    prev.content = Some(format!("{a}\n\n{b}"));
                }
                None => out.push(m),
                Some(_) => out.push(Message {
                    role: "user".into(),
                    ..m
                }),
            }
            continue;
        }
        if m.role == "assistant"
            && m.tool_calls.is_empty()
            && m.content.as_deref().unwrap_or("").trim().is_empty()
            && m.reasoning_content
                .as_deref()
                .unwrap_or("")
                .trim()
                .is_empty()
        {
            continue;
        }
        out.push(m);
    }
    out
}

/// Tool-call arguments given as a JSON string (OpenAI) become an object for the template; a string
/// that holds JSON of a string of an object (double-encoded by some clients) is decoded twice.
pub fn arguments_to_object(arguments: &Value) -> Result<Value, String> {
    match arguments {
        Value::Object(_) => Ok(arguments.clone()),
        Value::Null => Ok(Value::Object(Map::new())),
        Value::String(s) if s.trim().is_empty() => Ok(Value::Object(Map::new())),
        Value::String(s) => {
            let parsed: Value = serde_json::from_str(s)
                .map_err(|e| format!("arguments are not valid JSON ({e})"))?;
            match parsed {
                Value::Object(_) => Ok(parsed),
                Value::String(inner) => match serde_json::from_str::<Value>(&inner) {
                    Ok(v @ Value::Object(_)) => Ok(v),
                    _ => Err("arguments must be a JSON object".into()),
                },
                _ => Err("arguments must be a JSON object".into()),
            }
        }
        _ => Err("arguments must be a JSON object or a string holding one".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efforts_map_to_template_values() {
        assert_eq!(
            map_reasoning_effort("high").unwrap(),
            (Some(true), Some("xhigh".to_string()))
        );
        assert_eq!(map_reasoning_effort("none").unwrap(), (Some(false), None));
        assert!(map_reasoning_effort("extreme").is_err());
    }

    #[test]
    fn arguments_decoding() {
        let v = arguments_to_object(&Value::String("{\"a\":1}".into())).unwrap();
        assert_eq!(v["a"], 1);
        let double = Value::String(serde_json::to_string("{\"a\":2}").unwrap());
        assert_eq!(arguments_to_object(&double).unwrap()["a"], 2);
        assert!(arguments_to_object(&Value::String("[1]".into())).is_err());
        assert!(arguments_to_object(&Value::String("{oops".into())).is_err());
    }

    #[test]
    fn late_system_becomes_user_and_empty_assistant_dropped() {
        let msg = |role: &str, content: &str| Message {
            role: role.into(),
            content: Some(content.into()),
            ..Message::default()
        };
        let out = normalise_roles(vec![
            msg("system", "a"),
            msg("system", "b"),
            msg("user", "hi"),
            msg("assistant", " "),
            msg("system", "late"),
        ]);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "user"]);
        assert_eq!(out[0].content.as_deref(), Some("a\n\nb"));
    }
}
