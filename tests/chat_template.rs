//! Chat-template rendering against transformers: `chat_cases.json` holds 9 conversations rendered
//! by transformers 5.24.0 `apply_chat_template` with the template stored in the tiny GGUF, and
//! their token ids.

use serde_json::{Map, Value as Json, json};
use strata::chat::{ChatError, ChatTemplate, Message, RenderOptions, ToolCall};
use strata::gguf::{Gguf, GgufWriter};
use strata::tokenizer::Tokenizer;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny");

fn tiny_gguf() -> Gguf {
    Gguf::open(format!("{FIXTURES}/tiny-F16.gguf")).expect("tiny-F16.gguf opens")
}

/// A message of the fixture (OpenAI/HF shape) as the server's `Message`.
fn message_from_json(m: &Json) -> Message {
    let text = |key: &str| m.get(key).and_then(Json::as_str).map(str::to_string);
    let tool_calls = m
        .get("tool_calls")
        .and_then(Json::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    id: c.get("id").and_then(Json::as_str).unwrap_or("").to_string(),
                    name: c["function"]["name"].as_str().expect("name").to_string(),
                    arguments: c["function"]["arguments"].clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Message {
        role: text("role").expect("role"),
        content: text("content"),
        reasoning_content: text("reasoning_content"),
        tool_calls,
        tool_call_id: text("tool_call_id"),
        name: text("name"),
    }
}

fn options_from_json(case: &Json) -> RenderOptions {
    let kw = case["kw"].as_object().expect("kw");
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
        enable_thinking: kw.get("enable_thinking").and_then(Json::as_bool),
        reasoning_effort: kw
            .get("reasoning_effort")
            .and_then(Json::as_str)
            .map(str::to_string),
        tools: kw
            .get("tools")
            .and_then(Json::as_array)
            .map(|tools| tools.to_vec()),
        extra: Map::new(),
    }
}

#[test]
fn all_chat_cases_render_and_tokenize_like_transformers() {
    let gguf = tiny_gguf();
    let template = ChatTemplate::from_gguf(&gguf).expect("the tiny GGUF has a template");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let raw = std::fs::read_to_string(format!("{FIXTURES}/chat_cases.json")).expect("cases");
    let cases: Vec<Json> = serde_json::from_str(&raw).expect("valid JSON");
    assert_eq!(cases.len(), 9);

    let (mut same_text, mut same_ids) = (0, 0);
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(message_from_json)
            .collect();
        let text = template
            .render(&messages, &options_from_json(case))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want_text = case["text"].as_str().expect("text");
        if text == want_text {
            same_text += 1;
        } else {
            eprintln!("{name}: text differs\n--- got\n{text}\n--- want\n{want_text}");
        }
        let ids = tokenizer.encode(&text, true).expect("encodes");
        let want_ids: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        if ids == want_ids {
            same_ids += 1;
        } else {
            eprintln!("{name}: ids differ");
        }
    }
    assert_eq!(
        (same_text, same_ids),
        (9, 9),
        "(identical texts, identical ids) of 9"
    );
}

#[test]
fn json_encoded_arguments_render_like_a_mapping() {
    let template = ChatTemplate::from_gguf(&tiny_gguf()).expect("template");
    let call = |arguments: Json| Message {
        role: "assistant".into(),
        content: Some(String::new()),
        tool_calls: vec![ToolCall {
            id: "call_0".into(),
            name: "read_file".into(),
            arguments,
        }],
        ..Message::default()
    };
    let user = Message {
        role: "user".into(),
        content: Some("go".into()),
        ..Message::default()
    };
    let options = RenderOptions::default();
    let as_mapping = template
        .render(
            &[user.clone(), call(json!({"path": "a.txt", "limit": 10}))],
            &options,
        )
        .expect("renders");
    let as_string = template
        .render(
            &[user, call(json!("{\"path\": \"a.txt\", \"limit\": 10}"))],
            &options,
        )
        .expect("renders");
    assert_eq!(as_string, as_mapping);
    assert!(
        as_mapping.contains("<parameter=limit>\n10\n</parameter>"),
        "{as_mapping}"
    );
}

#[test]
fn template_source_is_the_fixture_file() {
    let template = ChatTemplate::from_gguf(&tiny_gguf()).expect("template");
    let file = std::fs::read_to_string(format!("{FIXTURES}/chat_template.jinja")).expect("file");
    assert_eq!(template.source().trim_end(), file.trim_end());
}

#[test]
fn template_refusals_are_reported_as_such() {
    let template = ChatTemplate::from_gguf(&tiny_gguf()).expect("template");
    let user = Message {
        role: "user".into(),
        content: Some("hi".into()),
        ..Message::default()
    };
    let bad_effort = RenderOptions {
        reasoning_effort: Some("maximum".into()),
        ..RenderOptions::default()
    };
    match template.render(std::slice::from_ref(&user), &bad_effort) {
        Err(ChatError::Refused(message)) => {
            assert_eq!(message, "Unknown reasoning_effort: maximum")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let late_system = [
        user.clone(),
        Message {
            role: "system".into(),
            content: Some("late".into()),
            ..Message::default()
        },
    ];
    assert!(matches!(
        template.render(&late_system, &RenderOptions::default()),
        Err(ChatError::Refused(_))
    ));
}

#[test]
fn gguf_without_template_is_an_error() {
    let source = tiny_gguf();
    let mut writer = GgufWriter::new();
    for (key, value) in source.metadata() {
        if key != "tokenizer.chat_template" {
            writer.add_metadata(key.clone(), value.clone());
        }
    }
    let gguf = Gguf::from_vec("no-template.gguf", writer.to_bytes()).expect("parses");
    let err = ChatTemplate::from_gguf(&gguf).expect_err("no template");
    assert!(matches!(err, ChatError::NoTemplate));
    assert!(err.to_string().contains("tokenizer.chat_template"), "{err}");
}

#[test]
fn broken_template_source_is_a_syntax_error() {
    let err = ChatTemplate::from_source("{% for m in messages %}{{ m.role }}").expect_err("bad");
    assert!(matches!(err, ChatError::Syntax(_)), "{err:?}");
}

/// A Qwen-style template written for this test: it uses the Python-isms real templates lean on
/// (tools through `tojson`, `| items`, `is mapping`, `.startswith`, `.strip()`, `.split()`,
/// `namespace`, `loop.last`, `strftime_now`, `bos_token`) and the thinking switch.
const HAND_TEMPLATE: &str = r#"{%- set ns = namespace(calls=0) -%}
{%- if tools -%}
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
{% endif -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' and message.tool_calls is defined -%}
{{- message.role }}:
{%- if message.reasoning_content is defined and (enable_thinking is not defined or enable_thinking) %} [think: {{ message.reasoning_content.strip() }}]{% endif %}
{%- for call in message.tool_calls -%}
{%- set ns.calls = ns.calls + 1 %} call {{ call.function.name }}(
{%- if call.function.arguments is mapping -%}
{%- for key, value in call.function.arguments | items -%}
{{ key }}={{ value if value is string else value | tojson }}{{ ", " if not loop.last }}
{%- endfor -%}
{%- endif -%})
{%- endfor %}
{% elif message.role == 'tool' -%}
tool[{{ message.tool_call_id }}]: {{ message.content.split('\n')[0] }}
{% else -%}
{{ message.role }}: {{ message.content | trim }}{% if message.content.startswith('!') %} (shouting){% endif %}
{% endif -%}
{%- endfor -%}
calls={{ ns.calls }} year={{ strftime_now('%Y') | length }}
{%- if add_generation_prompt %}
assistant:{% if enable_thinking is defined and not enable_thinking %} <no-think>{% else %} <think>{% endif %}
{%- endif -%}"#;

#[test]
fn hand_written_template_with_tools_and_thinking() {
    let template = ChatTemplate::from_source(HAND_TEMPLATE).expect("compiles");
    let messages = vec![
        Message {
            role: "user".into(),
            content: Some("!read a.txt ".into()),
            ..Message::default()
        },
        Message {
            role: "assistant".into(),
            content: None,
            reasoning_content: Some("  need the file \n".into()),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.txt", "limit": 10, "opts": {"raw": true}}),
            }],
            ..Message::default()
        },
        Message {
            role: "tool".into(),
            content: Some("line one\nline two".into()),
            tool_call_id: Some("call_1".into()),
            ..Message::default()
        },
    ];
    let tools = vec![json!({
        "type": "function",
        "function": {"name": "read_file", "description": "Read — a file", "parameters": {"type": "object"}}
    })];
    let mut options = RenderOptions {
        add_generation_prompt: true,
        tools: Some(tools),
        ..RenderOptions::default()
    };
    let rendered = template.render(&messages, &options).expect("renders");
    // Rendered by Python Jinja2 3.1.6 with transformers' settings (trim_blocks, lstrip_blocks,
    // json.dumps-based tojson) from the same template and inputs.
    let expected = concat!(
        r#"<tools>{"type": "function", "function": {"name": "read_file", "description": "Read — a file", "parameters": {"type": "object"}}}</tools>"#,
        "\nuser: !read a.txt (shouting)",
        r#"assistant: [think: need the file] call read_file(path=a.txt, limit=10, opts={"raw": true})"#,
        "tool[call_1]: line one\ncalls=1 year=4assistant: <think>",
    );
    assert_eq!(rendered, expected);

    options.enable_thinking = Some(false);
    options.tools = None;
    let rendered = template.render(&messages, &options).expect("renders");
    assert_eq!(
        rendered,
        concat!(
            "user: !read a.txt (shouting)",
            r#"assistant: call read_file(path=a.txt, limit=10, opts={"raw": true})"#,
            "tool[call_1]: line one\ncalls=1 year=4assistant: <no-think>",
        )
    );

    // `extra` reaches the template and overrides the named options.
    let template =
        ChatTemplate::from_source("{{ custom }}/{{ add_generation_prompt }}").expect("ok");
    let mut extra = Map::new();
    extra.insert("custom".into(), json!("x"));
    extra.insert("add_generation_prompt".into(), json!("overridden"));
    let options = RenderOptions {
        extra,
        ..RenderOptions::default()
    };
    assert_eq!(
        template.render(&[], &options).expect("renders"),
        "x/overridden"
    );
}

#[test]
fn gguf_special_tokens_are_template_variables() {
    let gguf = tiny_gguf();
    let source = "{{ eos_token }}";
    let mut writer = GgufWriter::new();
    for (key, value) in gguf.metadata() {
        if key == "tokenizer.chat_template" {
            writer.add_metadata(key.clone(), strata::gguf::Value::String(source.into()));
        } else {
            writer.add_metadata(key.clone(), value.clone());
        }
    }
    let edited = Gguf::from_vec("eos.gguf", writer.to_bytes()).expect("parses");
    let template = ChatTemplate::from_gguf(&edited).expect("template");
    assert_eq!(
        template
            .render(&[], &RenderOptions::default())
            .expect("renders"),
        "<|endoftext|>"
    );
}
