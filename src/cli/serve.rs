//! `strata serve`: the OpenAI- and Anthropic-compatible HTTP server.
//!
//! The port is bound first and the model loaded in the background, so `/health` can answer
//! `loading` (503) while a large model loads and `ok` once it is ready.

use std::sync::Arc;

use anyhow::Context as _;

use crate::cli::load::{ModelArgs, load_backend_with, open_gguf};
use crate::server::webui::{WebUi, serve_app};
use crate::server::{AppState, DEFAULT_QUEUE, LoadedModel, ServerConfig};
use crate::tiers::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`) on every route but /health.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Requests allowed to wait for a generation slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = DEFAULT_QUEUE)]
    pub queue: usize,
    /// Do not serve the built-in web page at `/` (the API is unchanged).
    #[arg(long)]
    pub no_webui: bool,
    /// Open the web page in the default browser once the server is listening.
    #[arg(long)]
    pub open: bool,
    /// Requests generating concurrently, advanced one step each per round (on the GPU their
    /// decode steps share one forward pass); each one's output is the same as if it ran alone.
    /// Default: 8 on the GPU with every expert in VRAM, else 4.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: Option<u16>,
    /// Memory the prompt cache may hold, e.g. 4GiB, 512MiB (0 turns it off). Cached
    /// conversations are whole sequence states (VRAM on the GPU: a KV cache for the whole context
    /// and the recurrent state), least recently used evicted first; `strata inspect --plan` does
    /// not count them.
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size)]
    pub prompt_cache_size: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let address = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| {
            format!("cannot listen on {address} (is another server using that port? try --port)")
        })?;
    let local = listener.local_addr().context("reading the bound address")?;
    let state = AppState::new(ServerConfig {
        api_key: args.api_key.clone(),
        queue_capacity: args.queue,
        // 0: the loaded backend's default.
        parallel: args.parallel.map_or(0, usize::from),
        prompt_cache_bytes: usize::try_from(args.prompt_cache_size).unwrap_or(usize::MAX),
    });
    match &args.model.model {
        Some(path) => eprintln!("strata: loading {} …", path.display()),
        None => eprintln!(
            "strata: no --model given: serving the built-in demo model (random weights; its output is not meaningful)"
        ),
    }
    eprintln!(
        "strata: listening on http://{local} (GET /health answers 503 until the model is loaded)"
    );
    if args.api_key.is_some() {
        eprintln!("strata: API key required on every route but /health");
    }
    if !args.no_webui {
        eprintln!(
            "strata: web page at http://{local}/ (chat and monitor; --no-webui turns it off)"
        );
        if args.open {
            open_in_browser(&format!("http://{local}/"));
        }
    }
    let loader_state = state.clone();
    let model_args = args.model.clone();
    tokio::task::spawn_blocking(move || match load(&model_args) {
        Ok(model) => {
            let parallel = args
                .parallel
                .map_or_else(|| model.default_parallel(), usize::from);
            eprintln!(
                "strata: model {} ready (context {} tokens, {parallel} requests generate together: --parallel)",
                model.name, model.context_length
            );
            loader_state.set_model(model);
        }
        Err(e) => {
            let message = format!("{e:#}");
            eprintln!("strata: error: the model failed to load: {message}");
            loader_state.set_load_error(message);
        }
    });
    let web_ui = (!args.no_webui).then_some(WebUi {
        demo_model: args.model.model.is_none(),
    });
    serve_app(listener, state, web_ui)
        .await
        .context("serving HTTP")
}

/// Opens `url` with the desktop's default browser; a failure is a warning, not an error.
fn open_in_browser(url: &str) {
    let mut command = if cfg!(target_os = "macos") {
        std::process::Command::new("open")
    } else if cfg!(target_os = "windows") {
        let mut c = std::process::Command::new("cmd");
        c.args(["/C", "start", ""]);
        c
    } else {
        std::process::Command::new("xdg-open")
    };
    command
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    match command.spawn() {
        // Reap the opener in the background so it does not linger as a zombie.
        Ok(mut child) => {
            std::thread::spawn(move || child.wait());
        }
        Err(e) => eprintln!("strata: warning: cannot open a browser ({e}); open {url} yourself"),
    }
}

fn load(args: &ModelArgs) -> anyhow::Result<LoadedModel> {
    let gguf = open_gguf(args.model.as_deref())?;
    let backend = load_backend_with(Arc::clone(&gguf), args.backend, args.ctx, &args.tiers)?;
    // With --backend auto, say which one was picked: the GPU and CPU differ a lot in speed.
    eprintln!("strata: running on the {} backend", backend.info().backend);
    let mut model = LoadedModel::from_gguf(&gguf, backend)?;
    if args.model.is_none() {
        model.name = crate::model::demo::DEMO_MODEL_NAME.to_string();
    }
    Ok(model)
}
