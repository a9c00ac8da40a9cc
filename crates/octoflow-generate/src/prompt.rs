//! A prompt against the context it is fed into.

use crate::error::PromptError;

/// Prompt tokens run through a session in chunks of this many (one weight pass per chunk).
pub const PREFILL_CHUNK: usize = 256;

/// Checks that `prompt` can follow the `cached` positions of a context of `n_ctx` and leave room
/// for at least one generated token, and that its ids are in a vocabulary of `n_vocab`.
pub fn check_prompt(
    prompt: &[u32],
    cached: usize,
    n_ctx: usize,
    n_vocab: usize,
) -> Result<(), PromptError> {
    if prompt.is_empty() {
        return Err(PromptError::Empty);
    }
    if cached + prompt.len() >= n_ctx {
        return Err(PromptError::TooLong {
            prompt: prompt.len(),
            cached,
            n_ctx,
        });
    }
    match prompt.iter().position(|&id| id as usize >= n_vocab) {
        Some(index) => Err(PromptError::OutOfVocabulary {
            id: prompt[index],
            index,
            n_vocab,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_must_leave_room_for_one_token() {
        assert_eq!(check_prompt(&[], 0, 8, 10), Err(PromptError::Empty));
        assert!(check_prompt(&[1; 7], 0, 8, 10).is_ok());
        let err = check_prompt(&[1; 5], 3, 8, 10).unwrap_err();
        assert_eq!(
            err,
            PromptError::TooLong {
                prompt: 5,
                cached: 3,
                n_ctx: 8
            }
        );
        assert!(err.to_string().contains("context holds 8"), "{err}");
    }

    #[test]
    fn ids_outside_the_vocabulary_are_named() {
        let err = check_prompt(&[1, 2, 10], 0, 8, 10).unwrap_err();
        assert_eq!(
            err,
            PromptError::OutOfVocabulary {
                id: 10,
                index: 2,
                n_vocab: 10
            }
        );
    }
}
