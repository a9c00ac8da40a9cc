//! One module per subcommand.

pub mod common;
pub mod devices;
pub mod generate;
pub mod inspect;
pub mod perplexity;
pub mod pull;
pub mod run;
pub mod tokenize;
