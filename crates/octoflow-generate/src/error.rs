//! Why generation could not run.

use octoflow_model::ModelError;

/// A prompt that cannot be generated from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    #[error("the prompt is empty (no tokens to start from)")]
    Empty,
    #[error(
        "the prompt has {prompt} tokens and {cached} are already in the context, but the context \
         holds {n_ctx}; raise the context size or shorten the prompt"
    )]
    TooLong {
        prompt: usize,
        cached: usize,
        n_ctx: usize,
    },
    #[error(
        "token id {id} (prompt position {index}) is outside the vocabulary (n_vocab = {n_vocab})"
    )]
    OutOfVocabulary {
        id: u32,
        index: usize,
        n_vocab: usize,
    },
}

/// Why [`crate::generate()`] failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("writing the generated text: {0}")]
    Output(#[from] std::io::Error),
    #[error("the device ran no decode step")]
    NoDecodeStep,
}
