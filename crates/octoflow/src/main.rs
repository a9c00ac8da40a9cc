//! `octoflow`: the command line. Each subcommand lives in `cmd/<name>.rs`; this file only parses
//! arguments, sets up logging (to stderr) and dispatches.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "octoflow",
    version,
    about = "GPU-native LLM engine: run, serve and fine-tune GGUF models with Vulkan"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Many instances of one model driven by an agent program (queue, best-of, debate, swarm or
    /// your own, docs/VM.md) over a task file.
    Agents(cmd::agents::Args),
    /// Prompt-processing and generation throughput (like llama-bench).
    Bench(cmd::bench::Args),
    /// Convert a Hugging Face folder (config.json, SafeTensors, tokenizer.json) into a GGUF file.
    Convert(cmd::convert::Args),
    /// List Vulkan devices and the capabilities kernels are chosen by.
    Devices(cmd::devices::Args),
    /// Export a training run: a llama.cpp LoRA adapter GGUF, or the base with the adapters merged.
    Export(cmd::export::Args),
    /// Print a GGUF file's metadata and tensor table (like gguf-dump).
    Inspect(cmd::inspect::Args),
    /// Download a model (a name from the built-in list, or an http(s) URL of a .gguf) into the cache.
    Pull(cmd::pull::Args),
    /// Generate text from a prompt, or chat (--chat).
    Run(cmd::run::Args),
    /// OpenAI-compatible HTTP server with continuous batching over several instances.
    Serve(cmd::serve::Args),
    /// Mean negative log-likelihood and perplexity of a text file.
    Perplexity(cmd::perplexity::Args),
    /// Print the token ids of a text (like llama-tokenize).
    Tokenize(cmd::tokenize::Args),
    /// QLoRA fine-tuning on the GPU: frozen quantized base, LoRA adapters, AdamW.
    Train(cmd::train::Args),
}

fn main() -> std::process::ExitCode {
    restore_sigpipe();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // a log line that cannot be written (stderr closed under a running server) is dropped,
        // not reported by a panicking eprintln!
        .log_internal_errors(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OCTOFLOW_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,octoflow_access=info")
            }),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Agents(args) => cmd::agents::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Convert(args) => cmd::convert::run(args),
        Command::Devices(args) => cmd::devices::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Pull(args) => cmd::pull::run(args),
        Command::Run(args) => cmd::run::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Perplexity(args) => cmd::perplexity::run(args),
        Command::Tokenize(args) => cmd::tokenize::run(args),
        Command::Train(args) => cmd::train::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Rust ignores SIGPIPE, which turns `octoflow inspect ... | head` into a panic on the next print;
/// a command-line tool should instead end quietly like any other Unix filter.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
