//! The body of `POST /v1/agents/runs` and its validation into what the scheduler runs: the
//! program (a pattern or assembly text, exactly one), the tasks (shared with `octoflow agents`,
//! [`super::tasks`]) and the run's settings. Unknown fields are refused: unlike OpenAI's
//! routes, no client sends extra fields here by habit, and a misspelt `instances` would
//! otherwise run with the default silently.

use octoflow_agents::{Program, RunConfig};
use octoflow_core::SamplingParams;
use octoflow_text::{ChatTemplate, Tokenizer};
use serde::Deserialize;
use serde_json::Value;

use super::source::Source;
use super::tasks::TaskSpec;
use crate::api::range;
use crate::error::ApiError;

/// `POST /v1/agents/runs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// A shipped program: `queue`, `best-of`, `debate` or `swarm`.
    pub pattern: Option<String>,
    /// An agent program in the VM's assembly (docs/VM.md).
    pub program: Option<String>,
    /// `{"id", "prompt"}` or `{"id", "messages"}` objects.
    pub tasks: Vec<Value>,
    /// Instances (default 4; at most the server's).
    pub instances: Option<i64>,
    /// `%rounds` (default 1).
    pub rounds: Option<i64>,
    /// `%max`: the token limit of a generation (default 256).
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    /// Run seed (default: random).
    pub seed: Option<i64>,
}

/// A request checked and turned into a run's parts.
#[derive(Debug)]
pub struct Prepared {
    pub program: Program,
    /// `chunk` is the scheduler's to set.
    pub config: RunConfig,
    pub tasks: Vec<Vec<u32>>,
    pub ids: Vec<Value>,
}

/// Instances when the request does not say.
pub const DEFAULT_INSTANCES: usize = 4;

/// A count field of at least 1 (and at most `max`).
fn count(param: &str, v: Option<i64>, default: u64, max: u64) -> Result<u64, ApiError> {
    match v {
        None => Ok(default),
        Some(x) if x >= 1 && x as u64 <= max => Ok(x as u64),
        Some(x) => Err(ApiError::invalid(
            param.to_string(),
            format!("{param} must be between 1 and {max}, got {x}"),
        )
        .with_code("invalid_value")),
    }
}

/// The program the request names: exactly one of `pattern` and `program`.
fn source(req: &RunRequest) -> Result<Source, ApiError> {
    match (&req.pattern, &req.program) {
        (Some(p), None) => {
            Source::pattern(p).map_err(|e| ApiError::invalid("pattern".to_string(), e.to_string()))
        }
        (None, Some(text)) => Ok(Source::Text {
            name: "program".into(),
            text: text.clone(),
        }),
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "program".to_string(),
            "give `pattern` or `program`, not both",
        )),
        (None, None) => Err(ApiError::invalid(
            "pattern".to_string(),
            "give `pattern` (queue, best-of, debate or swarm) or `program` (assembly text, \
             docs/VM.md)",
        )),
    }
}

/// Checks `req` for a server of `n_slots` instances and tokenizes its program and tasks.
pub fn prepare(
    req: &RunRequest,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    n_slots: usize,
) -> Result<Prepared, ApiError> {
    let def = RunConfig::default();
    let instances = match req.instances {
        None => DEFAULT_INSTANCES.min(n_slots),
        Some(n) if n >= 1 && n as u64 <= n_slots as u64 => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "instances".to_string(),
                format!(
                    "instances must be between 1 and {n_slots} (the server's instances), got {n}"
                ),
            )
            .with_code("invalid_value"))
        }
    };
    let rounds = count("rounds", req.rounds, 1, u32::MAX as u64)? as u32;
    let max_tokens = count("max_tokens", req.max_tokens, 256, u32::MAX as u64)? as u32;
    let temperature = range("temperature", req.temperature, 0.0, 2.0)?.unwrap_or(def.temperature);
    let top_p = range("top_p", req.top_p, 0.0, 1.0)?.unwrap_or(def.top_p);
    let min_p = range("min_p", req.min_p, 0.0, 1.0)?.unwrap_or(def.min_p);
    let top_k = match req.top_k {
        None => def.top_k,
        Some(k) => u32::try_from(k.max(0)).unwrap_or(u32::MAX),
    };
    let seed = req
        .seed
        .map_or_else(octoflow_core::random_seed, |s| s as u64);
    SamplingParams {
        temperature,
        top_k: top_k as usize,
        top_p,
        min_p,
        seed,
        ..SamplingParams::default()
    }
    .validate()
    .map_err(|m| ApiError::invalid(None, m))?;
    let source = source(req)?;
    let program = source.assemble(tokenizer).map_err(|e| {
        let param = if req.pattern.is_some() {
            "pattern"
        } else {
            "program"
        };
        ApiError::invalid(param.to_string(), format!("{}: {e}", source.name()))
    })?;
    if req.tasks.is_empty() {
        return Err(ApiError::invalid(
            "tasks".to_string(),
            "tasks must hold at least one task",
        ));
    }
    let mut tasks = Vec::with_capacity(req.tasks.len());
    let mut ids = Vec::with_capacity(req.tasks.len());
    for (i, v) in req.tasks.iter().enumerate() {
        let task = TaskSpec::from_json(v, i)
            .and_then(|spec| spec.tokenize(tokenizer, template))
            .map_err(|e| ApiError::invalid("tasks".to_string(), format!("tasks[{i}]: {e}")))?;
        ids.push(task.id);
        tasks.push(task.tokens);
    }
    let config = RunConfig {
        instances,
        max_tokens,
        rounds,
        seed,
        temperature,
        top_k,
        top_p,
        min_p,
        eog: octoflow_generate::device_eog(tokenizer, false),
        device_sampling: true,
        ..def
    };
    Ok(Prepared {
        program,
        config,
        tasks,
        ids,
    })
}
