//! What several commands share: turning `-m MODEL` into a local file.

use std::path::PathBuf;

use anyhow::Context;

/// Resolves a `-m` argument (path, known model name or URL; `None` = the default model) to a local
/// `.gguf`, downloading it into the cache when needed.
pub fn model_path(spec: Option<&str>) -> anyhow::Result<PathBuf> {
    let spec = spec.unwrap_or_else(|| octoflow_hub::default_model());
    let opts = octoflow_hub::PullOptions::from_env()?;
    octoflow_hub::resolve_model(spec, &opts).with_context(|| format!("model {spec:?}"))
}

/// Opens a model's GGUF file.
pub fn open_gguf(spec: Option<&str>) -> anyhow::Result<(PathBuf, octoflow_gguf::GgufFile)> {
    let path = model_path(spec)?;
    let file = octoflow_gguf::GgufFile::open(&path)?;
    Ok((path, file))
}
