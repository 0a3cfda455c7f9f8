//! The output parser on a table of shapes: the format as the template asks for it, the
//! near-misses models drift into, and adversarial text; then every case again as a stream cut
//! into random pieces, which must give the same result.

use serde_json::{Map, Value, json};
use strata::chat::{
    ParsedOutput, StreamEvent, StreamParser, ToolSpec, parse_finished_output, parse_output,
    prompt_starts_in_reasoning,
};

fn tools() -> Vec<ToolSpec> {
    let tool = |name: &str, properties: Value| ToolSpec {
        name: name.to_string(),
        parameters: json!({"type": "object", "properties": properties}),
    };
    vec![
        tool(
            "read_file",
            json!({"path": {"type": "string"}, "limit": {"type": "integer"}}),
        ),
        tool(
            "grep",
            json!({
                "pattern": {"type": "string"},
                "paths": {"type": "array", "items": {"type": "string"}},
                "case_sensitive": {"type": "boolean"}
            }),
        ),
        tool(
            "write_file",
            json!({"path": {"type": "string"}, "content": {"type": "string"}}),
        ),
        tool(
            "configure",
            json!({
                "options": {"type": "object"},
                "ratio": {"type": "number"},
                "mode": {"type": ["string", "null"]}
            }),
        ),
    ]
}

struct Case {
    name: &'static str,
    text: String,
    starts_in_reasoning: bool,
    stopped_by_length: bool,
    content: &'static str,
    reasoning: Option<&'static str>,
    calls: Vec<(&'static str, Value)>,
    truncated: bool,
    /// Whether the parse must report something (unknown tool, dropped text, …).
    warns: bool,
}

impl Case {
    fn new(name: &'static str, text: impl Into<String>) -> Case {
        Case {
            name,
            text: text.into(),
            starts_in_reasoning: false,
            stopped_by_length: false,
            content: "",
            reasoning: None,
            calls: Vec::new(),
            truncated: false,
            warns: false,
        }
    }
    fn thinking(mut self) -> Case {
        self.starts_in_reasoning = true;
        self
    }
    fn cut_by_length(mut self) -> Case {
        self.stopped_by_length = true;
        self
    }
    fn content(mut self, content: &'static str) -> Case {
        self.content = content;
        self
    }
    fn reasoning(mut self, reasoning: &'static str) -> Case {
        self.reasoning = Some(reasoning);
        self
    }
    fn call(mut self, name: &'static str, arguments: Value) -> Case {
        self.calls.push((name, arguments));
        self
    }
    fn truncated(mut self) -> Case {
        self.truncated = true;
        self
    }
    fn warns(mut self) -> Case {
        self.warns = true;
        self
    }
}

/// The canonical XML call the template teaches, with values written verbatim.
fn xml_call(name: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<tool_call>\n<function={name}>\n");
    for (key, value) in params {
        s.push_str(&format!("<parameter={key}>\n{value}\n</parameter>\n"));
    }
    s.push_str("</function>\n</tool_call>");
    s
}

fn huge_value() -> String {
    let mut s = String::new();
    for i in 0..5000 {
        s.push_str(&format!("line {i}: <tag attr=\"{i}\"> a < b </tag>\n"));
    }
    s.push_str("end");
    s
}

fn cases() -> Vec<Case> {
    let read_a = || json!({"path": "a.txt", "limit": 10});
    let huge = huge_value();
    vec![
        // --- well-formed --------------------------------------------------------------------
        Case::new("plain answer after reasoning", "Let me think.\n</think>\n\nThe answer is 4.")
            .thinking()
            .reasoning("Let me think.")
            .content("The answer is 4."),
        Case::new("thinking off, plain answer", "Hello there!\n").content("Hello there!"),
        Case::new(
            "single call after reasoning",
            format!(
                "Need the file.\n</think>\n\n{}",
                xml_call("read_file", &[("path", "a.txt"), ("limit", "10")])
            ),
        )
        .thinking()
        .reasoning("Need the file.")
        .call("read_file", read_a()),
        Case::new(
            "parallel calls",
            format!(
                "{}\n{}",
                xml_call("read_file", &[("path", "a.txt"), ("limit", "10")]),
                xml_call("grep", &[("pattern", "foo"), ("paths", "[\"src\", \"tests\"]")])
            ),
        )
        .call("read_file", read_a())
        .call("grep", json!({"pattern": "foo", "paths": ["src", "tests"]})),
        Case::new(
            "prose before the call",
            format!("I'll read it.\n\n{}", xml_call("read_file", &[("path", "a.txt")])),
        )
        .content("I'll read it.")
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "text after the calls is kept",
            format!("{}\n\nLet me know.", xml_call("read_file", &[("path", "a.txt")])),
        )
        .content("Let me know.")
        .call("read_file", json!({"path": "a.txt"})),
        // --- near-misses --------------------------------------------------------------------
        Case::new(
            "zero-width space in the tool_call tags",
            "<\u{200B}tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n</function>\n</\u{200B}tool_call>",
        )
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "JSON inside tool_call",
            "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a.txt\", \"limit\": 10}}\n</tool_call>",
        )
        .call("read_file", read_a()),
        Case::new(
            "JSON with string-encoded arguments",
            "<tool_call>\n{\"name\": \"grep\", \"arguments\": \"{\\\"pattern\\\": \\\"x<y\\\"}\"}\n</tool_call>",
        )
        .call("grep", json!({"pattern": "x<y"})),
        Case::new(
            "missing </tool_call>",
            "<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n</function>",
        )
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "missing </function> and </tool_call>",
            "<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n",
        )
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "missing </parameter> before </function>",
            "<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</function>\n</tool_call>",
        )
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "missing </parameter> before the next parameter",
            "<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>",
        )
        .call("read_file", json!({"path": "a.txt", "limit": 5})),
        Case::new(
            "</parameter> inside a string value",
            "<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.md\n</parameter>\n<parameter=content>\nuse </parameter> to close\n</parameter>\n</function>\n</tool_call>",
        )
        .call("write_file", json!({"path": "notes.md", "content": "use </parameter> to close"})),
        Case::new(
            "two </parameter>: the last plausible one closes",
            "<tool_call>\n<function=write_file>\n<parameter=content>\nends with </parameter>\n</parameter>\n</function>\n</tool_call>",
        )
        .call("write_file", json!({"content": "ends with </parameter>"})),
        Case::new(
            "function name= variant",
            "<tool_call>\n<function name=\"read_file\">\n<parameter name=\"path\">\na.txt\n</parameter>\n</function>\n</tool_call>",
        )
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "no newlines and spaces around =",
            "<tool_call><function = read_file ><parameter=path>a.txt</parameter><parameter=limit> 10 </parameter></function></tool_call>",
        )
        .call("read_file", read_a()),
        Case::new(
            "unknown tool is kept and reported",
            xml_call("delete_everything", &[("really", "true")]),
        )
        .call("delete_everything", json!({"really": true}))
        .warns(),
        Case::new(
            "bare <function> without <tool_call>",
            "Reading.\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n</function>",
        )
        .content("Reading.")
        .call("read_file", json!({"path": "a.txt"})),
        Case::new(
            "two functions in one tool_call block",
            "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n</function>\n<function=read_file>\n<parameter=path>\nb\n</parameter>\n</function>\n</tool_call>",
        )
        .call("read_file", json!({"path": "a"}))
        .call("read_file", json!({"path": "b"})),
        Case::new(
            "missing </tool_call> between calls",
            format!(
                "<tool_call>\n<function=read_file>\n<parameter=path>\na\n</parameter>\n</function>\n{}",
                xml_call("grep", &[("pattern", "b")])
            ),
        )
        .call("read_file", json!({"path": "a"}))
        .call("grep", json!({"pattern": "b"})),
        Case::new(
            "JSON object as the function body",
            "<tool_call>\n<function=read_file>\n{\"path\": \"a.txt\", \"limit\": 10}\n</function>\n</tool_call>",
        )
        .call("read_file", read_a()),
        Case::new(
            "stray closing tags never reach the content",
            "Done.</tool_call>\n</function>\n</think>",
        )
        .content("Done."),
        Case::new(
            "parameters without a function tag: tool inferred",
            "<tool_call>\n<parameter=pattern>\nfoo\n</parameter>\n<parameter=case_sensitive>\nfalse\n</parameter>\n</tool_call>",
        )
        .call("grep", json!({"pattern": "foo", "case_sensitive": false}))
        .warns(),
        Case::new(
            "parameters without a function tag: ambiguous, dropped",
            "<tool_call>\n<parameter=path>\na.txt\n</parameter>\n</tool_call>",
        )
        .warns(),
        Case::new("unreadable call is dropped and reported", "<tool_call>\nnot a call at all\n</tool_call>")
            .warns(),
        Case::new(
            "think block opened by the output itself",
            "<think>\nhmm\n</think>\n\nAnswer.",
        )
        .reasoning("hmm")
        .content("Answer."),
        Case::new(
            "repeated <think> at the start of reasoning",
            "<think>\nabc\n</think>\n\nx",
        )
        .thinking()
        .reasoning("abc")
        .content("x"),
        Case::new(
            "call written inside an unclosed think block at the end",
            "I will read it.\n<tool_call>\n<function=read_file>\n<parameter=path>\na.txt\n</parameter>\n</function>\n</tool_call>",
        )
        .thinking()
        .reasoning("I will read it.")
        .call("read_file", json!({"path": "a.txt"}))
        .warns(),
        // --- typing by schema -------------------------------------------------------------
        Case::new(
            "string that looks like a number stays a string",
            xml_call("grep", &[("pattern", "00123"), ("case_sensitive", "True")]),
        )
        .call("grep", json!({"pattern": "00123", "case_sensitive": true})),
        Case::new(
            "lenient typed values",
            xml_call(
                "configure",
                &[("options", "{'deep': True, 'list': [1, 2,],}"), ("ratio", "0.5  \n"), ("mode", "null")],
            ),
        )
        .call("configure", json!({"options": {"deep": true, "list": [1, 2]}, "ratio": 0.5, "mode": "null"})),
        Case::new(
            "integer with trailing blank lines",
            "<tool_call>\n<function=read_file>\n<parameter=limit>\n10  \n\n\n</parameter>\n</function>\n</tool_call>",
        )
        .call("read_file", json!({"limit": 10})),
        Case::new(
            "value not matching its schema is kept and reported",
            xml_call("read_file", &[("limit", "ten")]),
        )
        .call("read_file", json!({"limit": "ten"}))
        .warns(),
        // --- adversarial --------------------------------------------------------------------
        Case::new(
            "tool-call markup inside reasoning stays reasoning",
            "Maybe <tool_call>\n<function=read_file>\n</function>\n</tool_call>? No.\n</think>\n\nDone.",
        )
        .thinking()
        .reasoning("Maybe <tool_call>\n<function=read_file>\n</function>\n</tool_call>? No.")
        .content("Done."),
        Case::new(
            "nested angle brackets in a value",
            xml_call("write_file", &[("content", "<div><b>x</b></div>\nif a < b && c > d {}")]),
        )
        .call("write_file", json!({"content": "<div><b>x</b></div>\nif a < b && c > d {}"})),
        Case::new(
            "code with closing tags in a value",
            "<tool_call>\n<function=write_file>\n<parameter=content>\nfn f() {}\n</function>\n// not the end\n</tool_call> neither\n\n</parameter>\n</function>\n</tool_call>",
        )
        .call(
            "write_file",
            json!({"content": "fn f() {}\n</function>\n// not the end\n</tool_call> neither\n"}),
        ),
        Case::new("huge value", xml_call("write_file", &[("path", "big.txt"), ("content", &huge)]))
            .call("write_file", json!({"path": "big.txt", "content": huge})),
        Case::new(
            "empty parameters",
            "<tool_call>\n<function=write_file>\n<parameter=path>\n</parameter>\n<parameter=content></parameter>\n</function>\n</tool_call>",
        )
        .call("write_file", json!({"path": "", "content": ""})),
        Case::new(
            "unicode everywhere",
            format!(
                "Читаю файл 📄\n{}",
                xml_call("read_file", &[("path", "données/日本語 🚀.txt")])
            ),
        )
        .content("Читаю файл 📄")
        .call("read_file", json!({"path": "données/日本語 🚀.txt"})),
        Case::new("literal less-than signs in content", "a < b and x<y, <div> too")
            .content("a < b and x<y, <div> too"),
        Case::new("function with no parameters", "<tool_call>\n<function=read_file>\n</function>\n</tool_call>")
            .call("read_file", json!({})),
        // --- cut off by max_tokens ------------------------------------------------------
        Case::new(
            "call cut off inside a value",
            "Writing.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nhalf of the",
        )
        .cut_by_length()
        .content("Writing.")
        .truncated()
        .warns(),
        Case::new("cut off inside the opening tag", "Sure.\n\n<tool_ca")
            .cut_by_length()
            .content("Sure.")
            .truncated(),
        Case::new(
            "cut off inside a JSON call",
            "<tool_call>\n{\"name\": \"read_file\", \"argum",
        )
        .cut_by_length()
        .truncated()
        .warns(),
        Case::new("cut off while thinking", "Still thinking about it")
            .thinking()
            .cut_by_length()
            .reasoning("Still thinking about it"),
        Case::new(
            "cut off after a complete call keeps it",
            format!("{}\n<tool_call>\n<function=gr", xml_call("read_file", &[("path", "a.txt")])),
        )
        .cut_by_length()
        .call("read_file", json!({"path": "a.txt"}))
        .truncated()
        .warns(),
    ]
}

fn check(case: &Case, got: &ParsedOutput) {
    let name = case.name;
    assert_eq!(got.content, case.content, "{name}: content");
    assert_eq!(
        got.reasoning.as_deref(),
        case.reasoning,
        "{name}: reasoning"
    );
    let calls: Vec<(String, Value)> = got
        .tool_calls
        .iter()
        .map(|c| (c.name.clone(), Value::Object(c.arguments.clone())))
        .collect();
    let want: Vec<(String, Value)> = case
        .calls
        .iter()
        .map(|(n, a)| (n.to_string(), a.clone()))
        .collect();
    assert_eq!(calls, want, "{name}: calls");
    assert_eq!(got.truncated_tool_call, case.truncated, "{name}: truncated");
    assert_eq!(
        !got.warnings.is_empty(),
        case.warns,
        "{name}: warnings {:?}",
        got.warnings
    );
    for markup in [
        "<tool_call",
        "tool_call>",
        "<function",
        "</function",
        "parameter>",
    ] {
        assert!(!got.content.contains(markup), "{name}: markup in content");
    }
}

#[test]
fn table_of_shapes() {
    let tools = tools();
    let cases = cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for case in &cases {
        let got = parse_finished_output(
            &case.text,
            case.starts_in_reasoning,
            &tools,
            case.stopped_by_length,
        );
        check(case, &got);
    }
}

#[test]
fn parse_output_is_the_natural_stop() {
    let tools = tools();
    let text = "<tool_call>\n<function=read_file>\n<parameter=path>\na.txt";
    // Ended by a stop token: recovered. Ended by max_tokens: reported and dropped.
    let natural = parse_output(text, false, &tools);
    assert_eq!(natural.tool_calls.len(), 1);
    assert!(!natural.truncated_tool_call);
    let cut = parse_finished_output(text, false, &tools, true);
    assert!(cut.tool_calls.is_empty() && cut.truncated_tool_call);
}

/// Deterministic chunking: splits at char boundaries into pieces of 1..=max_chars chars.
fn chunks(text: &str, seed: u64, max_chars: usize) -> Vec<&str> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let boundaries: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at + 1 < boundaries.len() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let step = 1 + (state % max_chars as u64) as usize;
        let next = (at + step).min(boundaries.len() - 1);
        pieces.push(&text[boundaries[at]..boundaries[next]]);
        at = next;
    }
    pieces
}

struct Streamed {
    events: Vec<StreamEvent>,
    output: ParsedOutput,
}

fn stream(case: &Case, pieces: &[&str], tools: &[ToolSpec]) -> Streamed {
    let mut parser = StreamParser::new(case.starts_in_reasoning, tools.to_vec());
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece));
    }
    let (last, output) = parser.finish(case.stopped_by_length);
    events.extend(last);
    Streamed { events, output }
}

fn check_events(case: &Case, streamed: &Streamed) {
    let name = case.name;
    let output = &streamed.output;
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut names: Vec<String> = Vec::new();
    let mut fragments: Vec<String> = Vec::new();
    let mut ended: Vec<bool> = Vec::new();
    for event in &streamed.events {
        match event {
            StreamEvent::Content(t) => {
                for markup in ["<tool_call", "<\u{200B}tool", "<function", "</"] {
                    assert!(
                        !t.contains(markup) || case.content.contains(markup),
                        "{name}: {t:?}"
                    );
                }
                content.push_str(t)
            }
            StreamEvent::Reasoning(t) => reasoning.push_str(t),
            StreamEvent::ToolCallStart { index, name: tool } => {
                assert_eq!(*index, names.len(), "{name}: call indices in order");
                names.push(tool.clone());
                fragments.push(String::new());
                ended.push(false);
            }
            StreamEvent::ToolCallArguments {
                index,
                json_fragment,
            } => {
                assert!(!ended[*index], "{name}: arguments after the end");
                fragments[*index].push_str(json_fragment);
            }
            StreamEvent::ToolCallEnd { index } => ended[*index] = true,
        }
    }
    assert_eq!(content, output.content, "{name}: streamed content");
    let final_reasoning = output.reasoning.clone().unwrap_or_default();
    assert!(
        reasoning.starts_with(&final_reasoning),
        "{name}: streamed reasoning"
    );
    let recovered_from_reasoning = output
        .warnings
        .iter()
        .any(|w| w.contains("inside unclosed <think>"));
    if !recovered_from_reasoning {
        assert_eq!(reasoning, final_reasoning, "{name}: streamed reasoning");
    }
    // Every kept call was streamed completely; a dropped (cut-off) one never got an end.
    let completed: Vec<usize> = (0..names.len()).filter(|&i| ended[i]).collect();
    assert_eq!(
        completed.len(),
        output.tool_calls.len(),
        "{name}: ended calls"
    );
    for (i, call) in output.tool_calls.iter().enumerate() {
        assert_eq!(names[i], call.name, "{name}: streamed name");
        let arguments: Map<String, Value> = serde_json::from_str(&fragments[i])
            .unwrap_or_else(|e| panic!("{name}: fragments {:?} are not JSON: {e}", fragments[i]));
        assert_eq!(arguments, call.arguments, "{name}: streamed arguments");
    }
}

#[test]
fn streaming_in_random_pieces_matches_whole_parse() {
    let tools = tools();
    for case in cases() {
        let whole = parse_finished_output(
            &case.text,
            case.starts_in_reasoning,
            &tools,
            case.stopped_by_length,
        );
        // Byte-sized pieces, the whole text at once, and seeded random cuts.
        let mut chunkings: Vec<Vec<&str>> =
            vec![chunks(&case.text, 0, 1), vec![case.text.as_str()]];
        let seeds = if case.text.len() > 10_000 { 3 } else { 40 };
        for seed in 1..=seeds {
            chunkings.push(chunks(&case.text, seed, 1 + (seed as usize % 9)));
        }
        for pieces in &chunkings {
            let streamed = stream(&case, pieces, &tools);
            assert_eq!(streamed.output, whole, "{}: streamed output", case.name);
            check_events(&case, &streamed);
        }
    }
}

#[test]
fn partial_tags_are_held_back_until_decided() {
    let mut parser = StreamParser::new(false, tools());
    assert_eq!(
        parser.push("Checking.\n<tool_ca"),
        vec![StreamEvent::Content("Checking.".into())]
    );
    // The held-back text turns out to be a call.
    let events = parser.push("ll>\n<function=read_file>\n");
    assert_eq!(
        events,
        vec![StreamEvent::ToolCallStart {
            index: 0,
            name: "read_file".into()
        }]
    );
    let mut parser = StreamParser::new(false, tools());
    assert_eq!(
        parser.push("x <tool"),
        vec![StreamEvent::Content("x".into())]
    );
    // ... or not, and comes out as text once that is certain.
    let text: String = parser
        .push("box> y")
        .into_iter()
        .map(|e| match e {
            StreamEvent::Content(t) => t,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(text, " <toolbox> y");
}

#[test]
fn string_values_stream_as_they_arrive() {
    let mut parser = StreamParser::new(false, tools());
    parser.push("<tool_call>\n<function=write_file>\n<parameter=content>\n");
    let events = parser.push("first line\nsecond");
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::ToolCallArguments { json_fragment, .. } => Some(json_fragment.as_str()),
            _ => None,
        })
        .collect();
    // The value's text is out before the parameter closes; the newline waits (it may be the
    // format's own newline before `</parameter>`).
    assert_eq!(text, "first line\\nsecond");
}

#[test]
fn prompt_reasoning_state() {
    assert!(prompt_starts_in_reasoning(
        "<|im_start|>assistant\n<think>\n"
    ));
    assert!(!prompt_starts_in_reasoning(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ));
    assert!(!prompt_starts_in_reasoning("<|im_start|>assistant\n"));
}

#[test]
fn tool_specs_from_client_json() {
    let openai =
        json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
    let anthropic = json!({"name": "g", "input_schema": {"type": "object"}});
    let specs = ToolSpec::list_from_tool_json(&[openai, anthropic, json!({"nameless": true})]);
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["f", "g"]);
    assert_eq!(specs[1].parameters, json!({"type": "object"}));
}

/// Seeded random soup of markup pieces, near-miss fragments and text: the parser must never
/// panic, never show tool-call markup as answer text, and give the same result however the
/// stream is cut.
#[test]
fn random_markup_soup_is_chunking_invariant() {
    const PIECES: [&str; 28] = [
        "<tool_call>",
        "</tool_call>",
        "<\u{200B}tool_call>",
        "</\u{200B}tool_call>",
        "<function=read_file>",
        "<function=grep>",
        "<function name=\"write_file\">",
        "</function>",
        "<parameter=path>",
        "<parameter=limit>",
        "<parameter=paths>",
        "</parameter>",
        "<think>",
        "</think>",
        "\n",
        "\n\n",
        " ",
        "a.txt",
        "10",
        "[\"x\"]",
        "{\"name\": \"grep\", \"arguments\": {\"pattern\": \"p\"}}",
        "<",
        ">",
        "</",
        "<tool_ca",
        "é🚀",
        "text",
        "<b>",
    ];
    let tools = tools();
    let mut state: u64 = 0x5eed_1234_abcd_ef01;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..400 {
        let pieces = 1 + (next() % 40) as usize;
        let text: String = (0..pieces)
            .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
            .collect();
        let case = Case {
            starts_in_reasoning: next() % 2 == 0,
            stopped_by_length: next() % 3 == 0,
            ..Case::new("soup", text)
        };
        let whole = parse_finished_output(
            &case.text,
            case.starts_in_reasoning,
            &tools,
            case.stopped_by_length,
        );
        for markup in [
            "<tool_call>",
            "</tool_call>",
            "tool_call>",
            "<function=",
            "<function name",
            "</function>",
            "<parameter=",
            "</parameter>",
        ] {
            assert!(
                !whole.content.contains(markup),
                "round {round}: {markup:?} in content {:?} of {:?}",
                whole.content,
                case.text
            );
        }
        for seed in 0..4 {
            let streamed = stream(
                &case,
                &chunks(&case.text, seed + round, 1 + seed as usize * 3),
                &tools,
            );
            assert_eq!(streamed.output, whole, "round {round}: {:?}", case.text);
            check_events(&case, &streamed);
        }
    }
}
