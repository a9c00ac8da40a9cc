//! One module per subcommand.

pub mod common;
pub mod devices;
pub mod inspect;
pub mod pull;
