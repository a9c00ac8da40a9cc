//! An agent run's host tasks as JSON objects (`{"id", "prompt"}` or `{"id", "messages"}`), read
//! the same way by `octoflow agents` (one object per line of a task file) and by
//! `POST /v1/agents/runs` (the `tasks` array): `prompt` is tokenized with the BOS token as
//! `octoflow run -p` does, `messages` are rendered with the chat template first.

use octoflow_text::{ChatTemplate, Message, TextError, Tokenizer};
use serde_json::{json, Value};

/// A host task: its id as given and its prompt's tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The `id` field as given (any JSON), or the task's index when absent.
    pub id: Value,
    /// The prompt's token ids (BOS first).
    pub tokens: Vec<u32>,
}

/// What a task holds before tokenizing: its id and its text or conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    pub id: Value,
    pub input: TaskInput,
}

/// A task's prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskInput {
    /// Plain text.
    Prompt(String),
    /// A conversation, rendered with the chat template (generation prompt added).
    Messages(Vec<Message>),
}

/// Why a task is refused (the caller says where: a file's line, an array index).
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("a task is a JSON object")]
    NotObject,
    #[error("each message needs a string \"role\" and \"content\"")]
    BadMessage,
    #[error("give \"prompt\" or \"messages\", not both")]
    Both,
    #[error("\"prompt\" must be a string")]
    PromptNotString,
    #[error("\"messages\" must be an array")]
    MessagesNotArray,
    #[error("a task needs \"prompt\" or \"messages\"")]
    Neither,
    #[error("the model has no chat template (a task given as messages needs one)")]
    NoTemplate,
    #[error("rendering the chat template: {0}")]
    Template(#[source] TextError),
}

impl TaskSpec {
    /// Reads task number `index` (its id when it has none) from a JSON value.
    pub fn from_json(v: &Value, index: usize) -> Result<Self, TaskError> {
        let Value::Object(obj) = v else {
            return Err(TaskError::NotObject);
        };
        let id = obj.get("id").cloned().unwrap_or_else(|| json!(index));
        let input = match (obj.get("prompt"), obj.get("messages")) {
            (Some(Value::String(p)), None) => TaskInput::Prompt(p.clone()),
            (None, Some(Value::Array(ms))) => {
                let mut messages = Vec::with_capacity(ms.len());
                for m in ms {
                    let (Some(Value::String(role)), Some(Value::String(content))) =
                        (m.get("role"), m.get("content"))
                    else {
                        return Err(TaskError::BadMessage);
                    };
                    messages.push(Message::new(role.clone(), content.clone()));
                }
                TaskInput::Messages(messages)
            }
            (Some(_), Some(_)) => return Err(TaskError::Both),
            (Some(_), None) => return Err(TaskError::PromptNotString),
            (None, Some(_)) => return Err(TaskError::MessagesNotArray),
            (None, None) => return Err(TaskError::Neither),
        };
        Ok(Self { id, input })
    }

    /// Whether tokenizing needs the chat template (a caller may load it only then).
    pub fn needs_template(&self) -> bool {
        matches!(self.input, TaskInput::Messages(_))
    }

    /// The task with its prompt tokenized (`template` is read for messages only).
    pub fn tokenize(
        self,
        tokenizer: &Tokenizer,
        template: Option<&ChatTemplate>,
    ) -> Result<Task, TaskError> {
        let text = match self.input {
            TaskInput::Prompt(p) => p,
            TaskInput::Messages(ms) => template
                .ok_or(TaskError::NoTemplate)?
                .render(&ms, true)
                .map_err(TaskError::Template)?,
        };
        Ok(Task {
            id: self.id,
            tokens: tokenizer.encode(&text, true, true),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(v: Value) -> String {
        TaskSpec::from_json(&v, 0).expect_err("refused").to_string()
    }

    #[test]
    fn a_task_without_an_id_takes_its_index() {
        let t = TaskSpec::from_json(&json!({"prompt": "hi"}), 3).expect("valid");
        assert_eq!(t.id, json!(3));
        assert_eq!(t.input, TaskInput::Prompt("hi".into()));
        let t = TaskSpec::from_json(&json!({"id": "a", "messages": []}), 0).expect("valid");
        assert!(t.needs_template());
    }

    #[test]
    fn malformed_tasks_say_what_is_wrong() {
        assert!(refused(json!(3)).contains("JSON object"));
        assert!(refused(json!({})).contains("needs"));
        assert!(refused(json!({"prompt": 1})).contains("string"));
        assert!(refused(json!({"messages": {}})).contains("array"));
        assert!(refused(json!({"prompt": "a", "messages": []})).contains("not both"));
        assert!(refused(json!({"messages": [{"role": "user"}]})).contains("\"content\""));
    }
}
