//! Per-run options of `octoflow train --config FILE.toml`: the long flags' names as TOML keys
//! (`rank = 8`, `lr = 1e-3`, `data = "a.jsonl"`, `targets = "q,v"` or `["q", "v"]`). The
//! command-line flags are the defaults every file overrides; relative paths are resolved
//! against the file's directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use octoflow_train::lora::{LoraConfig, Target};
use octoflow_train::run::TrainConfig;
use octoflow_train::schedule::Schedule;

/// Every key a run file may set.
pub const KEYS: &[&str] = &[
    "data",
    "eval",
    "output",
    "rank",
    "alpha",
    "dropout",
    "targets",
    "lr",
    "weight_decay",
    "schedule",
    "warmup",
    "epochs",
    "max_steps",
    "batch",
    "grad_accum",
    "seq_len",
    "max_grad_norm",
    "seed",
    "save_every",
    "eval_every",
];

/// The options of one run (one `--config` file, or the flags alone).
#[derive(Debug, Clone, PartialEq)]
pub struct RunOpts {
    /// Display name: the config file's stem (`train` without `--config`).
    pub name: String,
    /// Training data (JSONL).
    pub data: Option<PathBuf>,
    /// Evaluation data (JSONL).
    pub eval: Option<PathBuf>,
    /// Run directory.
    pub output: Option<PathBuf>,
    pub rank: usize,
    pub alpha: f32,
    pub dropout: f32,
    /// Comma-separated projection names (`all` for every one).
    pub targets: String,
    pub lr: f32,
    pub weight_decay: f32,
    /// `cosine`, `linear` or `constant`.
    pub schedule: String,
    pub warmup: u64,
    pub epochs: u64,
    pub max_steps: Option<u64>,
    pub batch: usize,
    pub grad_accum: usize,
    pub seq_len: usize,
    pub max_grad_norm: f32,
    pub seed: u64,
    pub save_every: u64,
    pub eval_every: u64,
}

impl RunOpts {
    /// The training options (AdamW's betas and epsilon are fixed: 0.9, 0.999, 1e-8).
    pub fn to_config(&self) -> anyhow::Result<TrainConfig> {
        let cfg = TrainConfig {
            lora: LoraConfig {
                rank: self.rank,
                alpha: self.alpha,
                dropout: self.dropout,
                targets: Target::parse_list(&self.targets)?,
            },
            lr: self.lr,
            weight_decay: self.weight_decay,
            schedule: self.schedule.parse::<Schedule>()?,
            warmup: self.warmup,
            epochs: self.epochs,
            max_steps: self.max_steps,
            batch: self.batch,
            grad_accum: self.grad_accum.max(1),
            seq_len: self.seq_len,
            max_grad_norm: self.max_grad_norm,
            seed: self.seed,
            save_every: self.save_every,
            eval_every: self.eval_every,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
        };
        cfg.lora.validate()?;
        Ok(cfg)
    }

    /// The run directory (an error naming the run when none was given).
    pub fn output(&self) -> anyhow::Result<&Path> {
        self.output
            .as_deref()
            .with_context(|| format!("run {}: no output directory", self.name))
    }

    /// The training data (an error naming the run when none was given).
    pub fn data(&self) -> anyhow::Result<&Path> {
        self.data
            .as_deref()
            .with_context(|| format!("run {}: no training data", self.name))
    }
}

/// Reads the run file `path` over `defaults` (the command-line flags).
pub fn load(path: &Path, defaults: &RunOpts) -> anyhow::Result<RunOpts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(path, &text, defaults)
}

/// Parses run file `text` (read from `path`) over `defaults`. Without an `output` key the run
/// directory is `defaults.output/<file stem>` (so runs never share one by default).
pub fn parse(path: &Path, text: &str, defaults: &RunOpts) -> anyhow::Result<RunOpts> {
    let file = path.display();
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("{file}: not a valid TOML file"))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let name = path
        .file_stem()
        .map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned());
    let mut o = defaults.clone();
    o.output = defaults.output.as_ref().map(|d| d.join(&name));
    o.name = name;
    for (key, v) in &table {
        let bad = |want: &str| anyhow::anyhow!("{file}: {key}: expected {want}, got {v}");
        let int = || -> anyhow::Result<u64> {
            v.as_integer()
                .and_then(|i| u64::try_from(i).ok())
                .ok_or_else(|| bad("a non-negative integer"))
        };
        let float = || -> anyhow::Result<f32> {
            v.as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .map(|f| f as f32)
                .ok_or_else(|| bad("a number"))
        };
        let string = || -> anyhow::Result<String> {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad("a string"))
        };
        let path = || -> anyhow::Result<PathBuf> { Ok(normalize(&dir.join(string()?))) };
        match key.as_str() {
            "data" => o.data = Some(path()?),
            "eval" => o.eval = Some(path()?),
            "output" => o.output = Some(path()?),
            "rank" => o.rank = int()? as usize,
            "alpha" => o.alpha = float()?,
            "dropout" => o.dropout = float()?,
            "targets" => {
                o.targets = match v.as_array() {
                    Some(list) => list
                        .iter()
                        .map(|t| t.as_str().ok_or_else(|| bad("a string or strings")))
                        .collect::<anyhow::Result<Vec<_>>>()?
                        .join(","),
                    None => string()?,
                }
            }
            "lr" => o.lr = float()?,
            "weight_decay" => o.weight_decay = float()?,
            "schedule" => o.schedule = string()?,
            "warmup" => o.warmup = int()?,
            "epochs" => o.epochs = int()?,
            "max_steps" => o.max_steps = Some(int()?),
            "batch" => o.batch = int()? as usize,
            "grad_accum" => o.grad_accum = int()? as usize,
            "seq_len" => o.seq_len = int()? as usize,
            "max_grad_norm" => o.max_grad_norm = float()?,
            "seed" => o.seed = int()?,
            "save_every" => o.save_every = int()?,
            "eval_every" => o.eval_every = int()?,
            _ => bail!("{file}: unknown key {key:?} (known: {})", KEYS.join(", ")),
        }
    }
    Ok(o)
}

/// `p` with `.` and `name/..` removed lexically (`cfg/../runs/a` → `runs/a`), for messages.
fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> RunOpts {
        RunOpts {
            name: "train".into(),
            data: Some("/cli/data.jsonl".into()),
            eval: None,
            output: Some("/runs".into()),
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: "q,k,v,o,gate,up,down".into(),
            lr: 2e-4,
            weight_decay: 0.01,
            schedule: "cosine".into(),
            warmup: 0,
            epochs: 1,
            max_steps: None,
            batch: 4,
            grad_accum: 1,
            seq_len: 512,
            max_grad_norm: 1.0,
            seed: 42,
            save_every: 100,
            eval_every: 0,
        }
    }

    #[test]
    fn every_key_overrides_its_default_and_paths_are_relative_to_the_file() {
        let text = r#"
            data = "a/train.jsonl"
            eval = "/abs/eval.jsonl"
            output = "out"
            rank = 8
            alpha = 16
            dropout = 0.05
            targets = ["q", "v"]
            lr = 1e-3
            weight_decay = 0.0
            schedule = "linear"
            warmup = 3
            epochs = 2
            max_steps = 10
            batch = 2
            grad_accum = 3
            seq_len = 128
            max_grad_norm = 0.5
            seed = 7
            save_every = 4
            eval_every = 5
        "#;
        let o = parse(Path::new("/cfg/run-a.toml"), text, &defaults()).unwrap();
        let up = parse(
            Path::new("/cfg/x.toml"),
            "data = \"../d/./t.jsonl\"",
            &defaults(),
        );
        assert_eq!(up.unwrap().data.as_deref(), Some(Path::new("/d/t.jsonl")));
        assert_eq!(o.name, "run-a");
        assert_eq!(o.data.as_deref(), Some(Path::new("/cfg/a/train.jsonl")));
        assert_eq!(o.eval.as_deref(), Some(Path::new("/abs/eval.jsonl")));
        assert_eq!(o.output.as_deref(), Some(Path::new("/cfg/out")));
        assert_eq!((o.rank, o.alpha, o.dropout), (8, 16.0, 0.05));
        assert_eq!(o.targets, "q,v");
        assert_eq!(
            (o.lr, o.weight_decay, o.schedule.as_str()),
            (1e-3, 0.0, "linear")
        );
        assert_eq!((o.warmup, o.epochs, o.max_steps), (3, 2, Some(10)));
        assert_eq!((o.batch, o.grad_accum, o.seq_len), (2, 3, 128));
        assert_eq!((o.max_grad_norm, o.seed), (0.5, 7));
        assert_eq!((o.save_every, o.eval_every), (4, 5));
        // every documented key was exercised
        let table: toml::Table = text.parse().unwrap();
        assert_eq!(table.len(), KEYS.len());
        let cfg = o.to_config().unwrap();
        assert_eq!(cfg.lora.targets, Target::parse_list("q,v").unwrap());
        assert_eq!(cfg.schedule, Schedule::Linear);
    }

    #[test]
    fn missing_keys_keep_the_command_line_values_and_output_gets_the_file_stem() {
        let o = parse(Path::new("cfg/b.toml"), "lr = 5e-4\n", &defaults()).unwrap();
        let want = RunOpts {
            name: "b".into(),
            lr: 5e-4,
            output: Some("/runs/b".into()),
            ..defaults()
        };
        assert_eq!(o, want);
        let mut d = defaults();
        (d.output, d.data) = (None, None);
        let o = parse(Path::new("c.toml"), "", &d).unwrap();
        let err = o.output().unwrap_err().to_string();
        assert!(err.contains("run c") && err.contains("output"), "{err}");
        assert!(o.data().is_err());
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_file_and_the_key() {
        let p = Path::new("/cfg/a.toml");
        let err = parse(p, "rank = 8\nlearning_rate = 1e-3\n", &defaults())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/cfg/a.toml") && err.contains("\"learning_rate\""),
            "{err}"
        );
        assert!(err.contains("lr"), "the known keys are listed: {err}");
        for (text, key) in [
            ("rank = \"eight\"", "rank"),
            ("rank = -1", "rank"),
            ("lr = \"fast\"", "lr"),
            ("data = 3", "data"),
            ("targets = [1]", "targets"),
        ] {
            let err = parse(p, text, &defaults()).unwrap_err().to_string();
            assert!(
                err.contains("/cfg/a.toml") && err.contains(key),
                "{text}: {err}"
            );
        }
        let err = format!("{:#}", parse(p, "rank = = 2", &defaults()).unwrap_err());
        assert!(err.contains("/cfg/a.toml") && err.contains("TOML"), "{err}");
        // values that parse but are invalid options fail in to_config
        let o = parse(p, "schedule = \"sawtooth\"", &defaults()).unwrap();
        assert!(o.to_config().is_err());
    }
}
