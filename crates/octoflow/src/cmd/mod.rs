//! One module per subcommand.

pub mod common;
pub mod inspect;
pub mod pull;
