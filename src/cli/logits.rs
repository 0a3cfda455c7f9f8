//! `strata logits`: logits for token ids or a prompt, written as a float32 `.npy`.
//!
//! Outside scripts (the oracle checker) call this with exactly these flags; keep them stable:
//! `--model PATH (--ids "1,2,3" | --ids-file F | --prompt TEXT) --out F.npy [--all]
//! [--prefill-chunk N] [--backend cpu|gpu|auto]`.

use std::path::PathBuf;

use anyhow::Context as _;

use super::load::{BackendChoice, load_backend_with, open_gguf};
use crate::tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["ids", "ids_file", "prompt"])))]
pub struct Args {
    /// GGUF model file (first shard of a split model). Without it, the built-in demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Token ids separated by commas and/or whitespace, e.g. "1,2,3".
    #[arg(long)]
    pub ids: Option<String>,
    /// A file holding token ids separated by commas and/or whitespace.
    #[arg(long, value_name = "FILE")]
    pub ids_file: Option<PathBuf>,
    /// Text to tokenize with the model's tokenizer (special tokens such as <|im_start|> are parsed).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Output `.npy` file: f32, shape [n, vocab] with --all, else [1, vocab].
    #[arg(long)]
    pub out: PathBuf,
    /// Write the logits of every input position instead of only the last one.
    #[arg(long)]
    pub all: bool,
    /// Feed the input N tokens per call (1 = token-by-token decode); default: all at once.
    #[arg(long, value_name = "N")]
    pub prefill_chunk: Option<usize>,
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Memory tiers (GPU backend): VRAM budget, expert source, PLE reader mode.
    #[command(flatten)]
    pub tiers: crate::tiers::TierArgs,
}

/// Parses ids separated by commas and/or whitespace.
pub fn parse_ids(text: &str) -> anyhow::Result<Vec<u32>> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("{s:?} is not a token id (a non-negative integer)"))
        })
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let gguf = open_gguf(args.model.as_deref())?;
    let ids = if let Some(text) = &args.ids {
        parse_ids(text)?
    } else if let Some(path) = &args.ids_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        parse_ids(&text).with_context(|| format!("in {}", path.display()))?
    } else if let Some(prompt) = &args.prompt {
        let tokenizer = Tokenizer::from_gguf(&gguf).context("reading the model's tokenizer")?;
        tokenizer
            .encode(prompt, true)
            .context("tokenizing the prompt")?
    } else {
        anyhow::bail!("give the input with --ids, --ids-file or --prompt");
    };
    if ids.is_empty() {
        anyhow::bail!("the input holds no tokens");
    }
    let chunk = match args.prefill_chunk {
        Some(0) => anyhow::bail!("--prefill-chunk must be at least 1"),
        Some(n) => n,
        None => ids.len(),
    };

    let backend = load_backend_with(gguf, args.backend, 0, &args.tiers)?;
    let vocab = backend.info().vocab_size;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        anyhow::bail!("token id {bad} is outside the vocabulary (size {vocab})");
    }
    let context = backend.info().context_length;
    if ids.len() > context {
        anyhow::bail!(
            "{} tokens exceed the model's context of {context}",
            ids.len()
        );
    }

    let mut sequence = backend.new_sequence()?;
    let mut logits = Vec::with_capacity(if args.all { ids.len() * vocab } else { vocab });
    let mut last = Vec::new();
    for piece in ids.chunks(chunk) {
        let out = sequence.feed(piece, args.all)?;
        if args.all {
            logits.extend_from_slice(&out);
        } else {
            last = out;
        }
    }
    if !args.all {
        logits = last;
    }
    let rows = logits.len() / vocab;
    crate::npy::write_f32(&args.out, &[rows, vocab], &logits)
        .with_context(|| format!("writing {}", args.out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_ids;

    #[test]
    fn ids_accept_commas_and_whitespace() {
        assert_eq!(
            parse_ids("1,2, 3\n4\t5,,").expect("parses"),
            vec![1, 2, 3, 4, 5]
        );
        assert!(parse_ids("1,-2").is_err());
        assert!(parse_ids("1,x").is_err());
        assert!(parse_ids(" \n").expect("parses").is_empty());
    }
}
