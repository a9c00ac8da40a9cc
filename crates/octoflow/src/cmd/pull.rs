//! `octoflow pull NAME|URL [--sha256 HEX] [--force]` and `octoflow pull --list`.
//!
//! Progress goes to stderr; the final path is the only thing printed on stdout, so scripts can
//! write `model=$(octoflow pull NAME)`.

use octoflow_hub::{human_bytes, list_models, parse_sha256, resolve_model, PullOptions};

/// Arguments of `octoflow pull`.
#[derive(clap::Args)]
pub struct Args {
    /// A model name (see --list), an http(s) URL of a .gguf file, or a path to one.
    #[arg(required_unless_present = "list", conflicts_with = "list")]
    model: Option<String>,
    /// Expected sha256 of the file (64 hex digits); a download that does not match is deleted.
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    /// Download again even if the file is already in the cache.
    #[arg(long)]
    force: bool,
    /// List the known models and whether each is in the cache.
    #[arg(long)]
    list: bool,
}

/// Runs `octoflow pull`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut opts = PullOptions::from_env()?;
    if args.list {
        return print_list(&opts);
    }
    let Some(spec) = args.model else {
        anyhow::bail!("give a model name, URL or path (or --list)");
    };
    opts.force = args.force;
    opts.sha256 = args.sha256.as_deref().map(parse_sha256).transpose()?;
    let path = resolve_model(&spec, &opts)?;
    println!("{}", path.display());
    Ok(())
}

fn print_list(opts: &PullOptions) -> anyhow::Result<()> {
    println!("cache: {}", opts.cache.root().display());
    println!(
        "{:<38} {:>9}  {:<6}  {:<8}  QUANT",
        "NAME", "SIZE", "CACHED", "ARCH"
    );
    for entry in list_models(&opts.cache)? {
        let cached = if entry.cached_bytes.is_some() {
            "yes"
        } else {
            "no"
        };
        let default = if entry.name == octoflow_hub::default_model() {
            " (default)"
        } else {
            ""
        };
        match entry.model {
            Some(m) => println!(
                "{:<38} {:>9}  {:<6}  {:<8}  {}{default}",
                entry.name,
                human_bytes(m.bytes),
                cached,
                m.arch,
                m.quant
            ),
            None => println!(
                "{:<38} {:>9}  {:<6}  {:<8}  (downloaded file)",
                entry.name,
                human_bytes(entry.cached_bytes.unwrap_or(0)),
                cached,
                "-"
            ),
        }
    }
    Ok(())
}
