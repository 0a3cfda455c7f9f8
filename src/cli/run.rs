//! `strata run`: generate from one prompt and stream the text to stdout (stats to stderr).

use std::io::{IsTerminal, Write};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::chat::toolcall::{ParsedOutput, StreamEvent, StreamParser};
use crate::chat::{ChatTemplate, Message, RenderOptions};
use crate::cli::load::{ModelArgs, load_backend_with, open_gguf};
use crate::engine::generate::{FinishReason, GenEvent, GenOutput, GenerateRequest, Generator};
use crate::sampler::SamplingParams;
use crate::tokenizer::{StreamDecoder, Tokenizer};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt. By default it becomes one user turn of the model's chat template.
    #[arg(long, short = 'p', required_unless_present = "prompt_text")]
    pub prompt: Option<String>,
    /// The prompt, given without -p (`strata run "Hello"`).
    #[arg(value_name = "PROMPT", conflicts_with = "prompt")]
    pub prompt_text: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Feed the prompt text as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Reasoning effort for the chat template: off, low, medium or high.
    #[arg(long)]
    pub think: Option<String>,
}

/// Sampling flags shared by `run` and `chat`; unset flags keep the model's defaults.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// 0 = no top-k cut.
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// Seed for reproducible sampling (default: a random one, printed with the stats).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn resolve(&self, defaults: &SamplingParams) -> anyhow::Result<SamplingParams> {
        let mut p = defaults.clone();
        if let Some(v) = self.temperature {
            p.temperature = v;
        }
        if let Some(v) = self.top_k {
            p.top_k = v;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.repetition_penalty {
            p.repetition_penalty = v;
        }
        p.seed = Some(self.seed.unwrap_or_else(crate::sampler::random_seed));
        p.validate()?;
        Ok(p)
    }
}

/// `--think` / `/think` value → (enable_thinking, template effort).
pub fn think_options(value: &str) -> anyhow::Result<(Option<bool>, Option<String>)> {
    crate::server::prompt::map_reasoning_effort(value).map_err(anyhow::Error::msg)
}

/// Writes generated text to stdout as it arrives: reasoning dimmed on a terminal (or marked
/// `[thinking]` when piped), the answer plain, tool calls as one line each.
pub struct TerminalPrinter {
    parser: Option<StreamParser>,
    dim: bool,
    in_reasoning: bool,
}

impl TerminalPrinter {
    /// `parse` = split reasoning / answer / tool calls (chat-template output); otherwise raw text.
    pub fn new(parse: bool, starts_in_reasoning: bool) -> TerminalPrinter {
        TerminalPrinter {
            parser: parse.then(|| StreamParser::new(starts_in_reasoning, Vec::new())),
            dim: std::io::stdout().is_terminal(),
            in_reasoning: false,
        }
    }

    fn set_reasoning(&mut self, out: &mut impl Write, reasoning: bool) -> std::io::Result<()> {
        if reasoning == self.in_reasoning {
            return Ok(());
        }
        self.in_reasoning = reasoning;
        match (reasoning, self.dim) {
            (true, true) => write!(out, "\x1b[2m"),
            (false, true) => writeln!(out, "\x1b[0m"),
            (true, false) => write!(out, "[thinking] "),
            (false, false) => writeln!(out, "\n[/thinking]"),
        }
    }

    fn print_events(&mut self, events: Vec<StreamEvent>) -> std::io::Result<()> {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for event in events {
            match event {
                StreamEvent::Reasoning(t) => {
                    self.set_reasoning(&mut out, true)?;
                    write!(out, "{t}")?;
                }
                StreamEvent::Content(t) => {
                    self.set_reasoning(&mut out, false)?;
                    write!(out, "{t}")?;
                }
                StreamEvent::ToolCallStart { name, .. } => {
                    self.set_reasoning(&mut out, false)?;
                    write!(out, "\n[tool call] {name} ")?;
                }
                StreamEvent::ToolCallArguments { json_fragment, .. } => {
                    write!(out, "{json_fragment}")?;
                }
                StreamEvent::ToolCallEnd { .. } => writeln!(out)?,
            }
        }
        out.flush()
    }

    pub fn push(&mut self, text: &str) -> std::io::Result<()> {
        match self.parser.as_mut() {
            Some(parser) => {
                let events = parser.push(text);
                self.print_events(events)
            }
            None => {
                let mut out = std::io::stdout().lock();
                write!(out, "{text}")?;
                out.flush()
            }
        }
    }

    /// Flush what the parser holds; returns the parsed output (None for raw text).
    pub fn finish(&mut self, stopped_by_length: bool) -> std::io::Result<Option<ParsedOutput>> {
        let Some(parser) = self.parser.take() else {
            println!();
            return Ok(None);
        };
        let (events, parsed) = parser.finish(stopped_by_length);
        self.print_events(events)?;
        let mut out = std::io::stdout().lock();
        self.set_reasoning(&mut out, false)?;
        writeln!(out)?;
        out.flush()?;
        Ok(Some(parsed))
    }
}

/// Prefill progress bar, shown only when the prompt takes more than a second.
struct PrefillProgress {
    started: Instant,
    bar: Option<indicatif::ProgressBar>,
}

impl PrefillProgress {
    fn new() -> Self {
        PrefillProgress {
            started: Instant::now(),
            bar: None,
        }
    }

    fn update(&mut self, done: usize, total: usize) {
        if self.bar.is_none() && done < total && self.started.elapsed() > Duration::from_secs(1) {
            let bar = indicatif::ProgressBar::new(total as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "prompt {bar:30} {pos}/{len} tokens {elapsed}",
            ) {
                bar.set_style(style);
            }
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
            if done >= total {
                bar.finish_and_clear();
            }
        }
    }
}

/// Run one generation, printing as it goes. Returns the output and the parsed answer.
pub fn generate_to_terminal(
    generator: &mut Generator,
    tokenizer: &Tokenizer,
    request: &GenerateRequest,
    printer: &mut TerminalPrinter,
) -> anyhow::Result<(GenOutput, Option<ParsedOutput>)> {
    let cancel = AtomicBool::new(false);
    let mut decoder = StreamDecoder::new(tokenizer);
    let mut progress = PrefillProgress::new();
    let mut print_error = None;
    let output = generator.generate(request, &mut decoder, &cancel, &mut |event| {
        let result = match event {
            GenEvent::PromptProgress { done, total } => {
                progress.update(done, total);
                Ok(())
            }
            GenEvent::Token { text, .. } | GenEvent::TrailingText(text) => printer.push(&text),
        };
        if let Err(e) = result {
            // stdout is gone (e.g. a closed pipe): stop generating.
            print_error.get_or_insert(e);
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    })?;
    if let Some(e) = print_error {
        return Err(anyhow::Error::new(e).context("writing to stdout"));
    }
    let parsed = printer.finish(output.finish == FinishReason::Length)?;
    Ok((output, parsed))
}

pub fn print_stats(output: &GenOutput) {
    let finish = match &output.finish {
        FinishReason::StopToken(_) => "stop token".to_string(),
        FinishReason::StopString(s) => format!("stop string {s:?}"),
        FinishReason::Length => "max tokens".to_string(),
        FinishReason::Cancelled => "cancelled".to_string(),
    };
    eprintln!(
        "prompt: {} tokens ({} cached) in {:.2} s, {:.1} tok/s | generated: {} tokens in {:.2} s, {:.1} tok/s | seed {} | ended by {finish}",
        output.usage.prompt_tokens,
        output.usage.cached_tokens,
        output.prefill_time.as_secs_f64(),
        output.prefill_tokens_per_second(),
        output.usage.completion_tokens,
        output.decode_time.as_secs_f64(),
        output.decode_tokens_per_second(),
        output.seed,
    );
}

/// Tokenizer, template and sampling defaults from the model, plus a generator on its backend.
pub struct LoadedForTerminal {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub defaults: SamplingParams,
    pub generator: Generator,
}

pub fn load_for_terminal(model: &ModelArgs) -> anyhow::Result<LoadedForTerminal> {
    if model.model.is_none() {
        eprintln!(
            "no --model given: using the built-in demo model (random weights, the text is not meaningful)"
        );
    }
    let gguf = open_gguf(model.model.as_deref())?;
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    let template = ChatTemplate::from_gguf(&gguf).ok();
    let defaults = SamplingParams::model_defaults(&gguf);
    let backend = load_backend_with(gguf, model.backend, model.ctx, &model.tiers)?;
    Ok(LoadedForTerminal {
        tokenizer,
        template,
        defaults,
        generator: Generator::new(backend),
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // clap guarantees one of the two; the message is for the impossible case.
    let Some(prompt_text) = args.prompt.clone().or_else(|| args.prompt_text.clone()) else {
        anyhow::bail!("no prompt: pass it as an argument or with --prompt");
    };
    let mut loaded = load_for_terminal(&args.model)?;
    let sampling = args.sampling.resolve(&loaded.defaults)?;
    let use_template = !args.raw && loaded.template.is_some();
    let text = match (&loaded.template, use_template) {
        (Some(template), true) => {
            let (enable_thinking, reasoning_effort) = match &args.think {
                Some(v) => think_options(v)?,
                None => (None, None),
            };
            let messages = [Message {
                role: "user".into(),
                content: Some(prompt_text.clone()),
                ..Message::default()
            }];
            let options = RenderOptions {
                add_generation_prompt: true,
                enable_thinking,
                reasoning_effort,
                ..RenderOptions::default()
            };
            template.render(&messages, &options)?
        }
        _ => prompt_text.clone(),
    };
    let prompt = loaded.tokenizer.encode(&text, true)?;
    let request = GenerateRequest {
        prompt,
        max_tokens: args.max_tokens,
        sampling,
        stop_ids: loaded.tokenizer.stop_ids(),
        stop_strings: Vec::new(),
        checkpoint: None,
    };
    loaded
        .generator
        .check_fits(request.prompt.len(), request.max_tokens)?;
    let starts_in_reasoning = use_template && crate::chat::prompt_starts_in_reasoning(&text);
    let mut printer = TerminalPrinter::new(use_template, starts_in_reasoning);
    let (output, _) = generate_to_terminal(
        &mut loaded.generator,
        &loaded.tokenizer,
        &request,
        &mut printer,
    )?;
    print_stats(&output);
    Ok(())
}
