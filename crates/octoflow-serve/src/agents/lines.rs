//! An agent run's output lines, as `octoflow agents` writes them to its output file and
//! `POST /v1/agents/runs` streams them: `{"id","instance","round","text","tokens","finish"}`
//! (`score` when finite) per output, `{"instance","error"}` per runtime error. For models that
//! answer in channels (gpt-oss's harmony format) `text` is the final channel and `reasoning`
//! the analysis channel (when there is one).

use octoflow_agents::Event;
use octoflow_text::harmony::{self, Reply};
use octoflow_text::Tokenizer;
use serde_json::{json, Value};

use crate::respond::finish_reason;

/// Turns a run's events into lines, counting what went by.
#[derive(Debug, Clone, Default)]
pub struct Lines {
    /// The host tasks' ids, by index (an output names its task by them).
    pub ids: Vec<Value>,
    /// Output lines so far.
    pub outputs: usize,
    /// Error lines so far.
    pub errors: usize,
    /// Tokens of the outputs so far.
    pub tokens: usize,
}

impl Lines {
    /// Lines for a run over tasks with these ids.
    pub fn new(ids: Vec<Value>) -> Self {
        Self {
            ids,
            ..Self::default()
        }
    }

    /// The line of `event` (its text decoded by `tokenizer`).
    pub fn line(&mut self, event: Event, tokenizer: &Tokenizer) -> Value {
        match event {
            Event::Output {
                instance,
                task,
                round,
                tokens,
                finish,
                score,
            } => {
                self.outputs += 1;
                self.tokens += tokens.len();
                let mut text = tokenizer.decode(&tokens);
                let mut reasoning = String::new();
                if harmony::uses_harmony(tokenizer.vocab()) {
                    let reply = Reply::parse(&text);
                    (text, reasoning) = (reply.content, reply.reasoning);
                }
                let mut line = json!({
                    "id": self.task_id(task),
                    "instance": instance,
                    "round": round,
                    "text": text,
                    "tokens": tokens.len(),
                    "finish": finish.map(finish_reason),
                });
                if !reasoning.is_empty() {
                    line["reasoning"] = json!(reasoning);
                }
                // NaN (sampled on the device) and -inf (an empty span) are not JSON numbers.
                if score.is_finite() {
                    line["score"] = json!(score);
                }
                line
            }
            Event::Error { instance, message } => {
                self.errors += 1;
                json!({ "instance": instance, "error": message })
            }
        }
    }

    fn task_id(&self, task: Option<u32>) -> Value {
        task.and_then(|t| self.ids.get(t as usize).cloned())
            .unwrap_or(Value::Null)
    }
}
