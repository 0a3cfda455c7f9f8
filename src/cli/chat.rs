//! `strata chat`: an interactive conversation in the terminal (also works with piped stdin).
//! Commands: `/think off|low|medium|high`, `/reset`, `/exit`.

use std::io::{BufRead, IsTerminal, Write};

use crate::chat::{Message, RenderOptions};
use crate::cli::load::ModelArgs;
use crate::cli::run::{
    SamplingArgs, TerminalPrinter, generate_to_terminal, load_for_terminal, print_stats,
    think_options,
};
use crate::engine::generate::GenerateRequest;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Tokens per reply at most.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 1024)]
    pub max_tokens: usize,
    /// A system prompt for the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Print timing stats after each reply.
    #[arg(long)]
    pub stats: bool,
}

const HELP: &str = "commands: /think off|low|medium|high, /reset, /exit";

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut loaded = load_for_terminal(&args.model)?;
    let Some(template) = loaded.template.take() else {
        anyhow::bail!("this model has no chat template; use `strata run --raw` instead");
    };
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("{HELP}");
    }
    let mut history: Vec<Message> = Vec::new();
    let mut enable_thinking: Option<bool> = None;
    let mut reasoning_effort: Option<String> = None;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let input = line.trim();
        if input.is_empty() {
            continue;
        }
        if let Some(command) = input.strip_prefix('/') {
            let mut parts = command.split_whitespace();
            match (parts.next(), parts.next()) {
                (Some("exit" | "quit"), _) => break,
                (Some("reset"), _) => {
                    history.clear();
                    loaded.generator.clear_cache();
                    eprintln!("(conversation cleared)");
                }
                (Some("think"), Some(level)) => match think_options(level) {
                    Ok((thinking, effort)) => {
                        enable_thinking = thinking;
                        reasoning_effort = effort;
                        eprintln!("(reasoning: {level})");
                    }
                    Err(e) => eprintln!("{e}"),
                },
                (Some("think"), None) => {
                    let now = match (enable_thinking, reasoning_effort.as_deref()) {
                        (Some(false), _) => "off",
                        (_, Some(effort)) => effort,
                        _ => "the template's default",
                    };
                    eprintln!("(reasoning: {now}; change it with /think off|low|medium|high)");
                }
                (Some("help"), _) => eprintln!("{HELP}"),
                _ => eprintln!("unknown command /{command}; {HELP}"),
            }
            continue;
        }
        let mut messages = Vec::with_capacity(history.len() + 2);
        if let Some(system) = &args.system {
            messages.push(Message {
                role: "system".into(),
                content: Some(system.clone()),
                ..Message::default()
            });
        }
        messages.extend(history.iter().cloned());
        let user = Message {
            role: "user".into(),
            content: Some(input.to_string()),
            ..Message::default()
        };
        messages.push(user.clone());
        let options = RenderOptions {
            add_generation_prompt: true,
            enable_thinking,
            reasoning_effort: reasoning_effort.clone(),
            ..RenderOptions::default()
        };
        let text = match template.render(&messages, &options) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                continue;
            }
        };
        let prompt = loaded.tokenizer.encode(&text, true)?;
        let context = loaded.generator.context_length();
        let max_tokens = args.max_tokens.min(context.saturating_sub(prompt.len()));
        if max_tokens == 0 {
            eprintln!(
                "error: the conversation ({} tokens) fills the context ({context}); /reset to start over",
                prompt.len()
            );
            continue;
        }
        let checkpoint = crate::server::prompt::generation_prompt_start(
            &template,
            &messages,
            &options,
            &loaded.tokenizer,
            &prompt,
        );
        let request = GenerateRequest {
            prompt,
            max_tokens,
            sampling: args.sampling.resolve(&loaded.defaults)?,
            stop_ids: loaded.tokenizer.stop_ids(),
            stop_strings: Vec::new(),
            checkpoint,
        };
        let mut printer =
            TerminalPrinter::new(true, crate::chat::prompt_starts_in_reasoning(&text));
        match generate_to_terminal(
            &mut loaded.generator,
            &loaded.tokenizer,
            &request,
            &mut printer,
        ) {
            Ok((output, parsed)) => {
                if args.stats {
                    print_stats(&output);
                }
                let parsed = parsed.unwrap_or_default();
                history.push(user);
                history.push(Message {
                    role: "assistant".into(),
                    content: Some(parsed.content),
                    reasoning_content: parsed.reasoning,
                    ..Message::default()
                });
            }
            // A failed reply leaves the history as it was; the next line tries again.
            Err(e) => eprintln!("error: {e:#}"),
        }
    }
    Ok(())
}
