//! The `strata` command line: one binary, one subcommand per job. Each subcommand lives in its own
//! file with its clap `Args` and a `run` function; this file only dispatches and reports errors as
//! one line `error: …` with a non-zero exit code.

pub mod bench;
pub mod chat;
pub mod inspect;
pub mod load;
pub mod logits;
pub mod run;
pub mod serve;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "strata",
    version,
    about = "Inference engine and server for Qwen3.8-Flash-Next GGUF models (wgpu + CPU reference)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// GPU adapter to use, by its index in `strata inspect --gpus` (default: the first discrete GPU).
    #[arg(long, global = true, value_name = "N")]
    pub adapter: Option<usize>,
    /// Graphics API for the GPU (default: `WGPU_BACKEND` when set, else every one the platform
    /// has: Vulkan on Linux, Metal on macOS, DX12 and Vulkan on Windows). OpenGL is not supported.
    #[arg(long, global = true, value_enum, value_name = "API")]
    pub gpu_backend: Option<GpuApi>,
}

/// `--gpu-backend`: a wgpu backend strata's kernels run on (all of them have subgroups).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuApi {
    Vulkan,
    Metal,
    Dx12,
}

impl GpuApi {
    /// The name `WGPU_BACKEND` takes for this backend.
    pub fn wgpu_name(self) -> &'static str {
        match self {
            GpuApi::Vulkan => "vulkan",
            GpuApi::Metal => "metal",
            GpuApi::Dx12 => "dx12",
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the model over HTTP (OpenAI- and Anthropic-compatible). Without --model, serves a tiny built-in demo model.
    Serve(serve::Args),
    /// Generate text from a prompt and stream it to stdout.
    Run(run::Args),
    /// Interactive terminal chat.
    Chat(chat::Args),
    /// Measure prefill / decode speed and bandwidth.
    Bench(bench::Args),
    /// Print a GGUF's metadata, tensors and the model config as the engine reads it.
    Inspect(inspect::Args),
    /// Compute logits for token ids or a prompt and write them as .npy.
    Logits(logits::Args),
}

/// Entry point used by `main`; returns the process exit code.
pub fn main() -> i32 {
    quiet_mesa_warning();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if let Some(index) = cli.adapter {
        // The GPU backend reads the adapter choice from STRATA_ADAPTER wherever it creates a
        // device; the flag is the same setting spelled as an option.
        // SAFETY: still single-threaded here (nothing has been spawned before parsing).
        unsafe { std::env::set_var("STRATA_ADAPTER", index.to_string()) };
    }
    if let Some(api) = cli.gpu_backend {
        // The instance reads the backend choice from WGPU_BACKEND (src/gpu/device.rs); the flag
        // is the same setting and wins over an inherited value.
        // SAFETY: still single-threaded here, as above.
        unsafe { std::env::set_var("WGPU_BACKEND", api.wgpu_name()) };
    }
    init_tracing();
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Logits(a) => logits::run(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            // One line a person can act on; the chain gives the cause after the context.
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            1
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour escapes only on a terminal: logs redirected to a file stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Mesa's Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid or not set" on every start when
/// the variable is missing (servers, CI, containers), which reads like a strata failure. Mesa only
/// uses it for window-system sockets that compute never opens, so point it at the temp dir.
fn quiet_mesa_warning() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // SAFETY: called first thing in `main`, before any other thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}
