//! Why a generation ended, whichever path generated it (the CPU loop, the device's own stop in
//! a multi-step chain, the server's scheduler).

/// Why a generation (one choice) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token (EOS, EOT, ...).
    Eog,
    /// A stop string.
    Stop,
    /// The token limit (`max_tokens`).
    Length,
    /// The context is full.
    Context,
}
