//! One module per subcommand.

pub mod agents;
pub mod batched;
pub mod bench;
pub mod channels;
pub mod common;
pub mod convert;
pub mod devices;
pub mod export;
pub mod homeo;
pub mod inspect;
pub mod perplexity;
pub mod profile;
pub mod pull;
pub mod run;
pub mod serve;
pub mod tokenize;
pub mod train;
pub mod train_config;
pub mod warm;
