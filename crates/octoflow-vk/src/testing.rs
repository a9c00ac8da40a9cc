//! Helpers for tests that need a Vulkan device (here and in the kernel crates).

use crate::context::{Context, DeviceChoice};

/// Set to `1` to skip GPU tests on a machine without Vulkan; they then print a skip line.
pub const SKIP_ENV: &str = "OCTOFLOW_SKIP_GPU_TESTS";

/// A device for test `name`: `None` (after printing a skip line) when `OCTOFLOW_SKIP_GPU_TESTS=1`.
/// Without that variable a missing device fails the test with the reason, so a machine that
/// should run GPU tests can never pass them silently.
pub fn gpu_or_skip(name: &str) -> Option<Context> {
    if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
        println!("skipped {name}: {SKIP_ENV}=1");
        return None;
    }
    match Context::new(DeviceChoice::Auto) {
        Ok(ctx) => Some(ctx),
        Err(e) => panic!("{name} needs a Vulkan device: {e} (set {SKIP_ENV}=1 to skip GPU tests)"),
    }
}

/// Panics if the validation layer (on with `OCTOFLOW_VALIDATION=1`) reported errors.
pub fn assert_no_validation_errors(ctx: &Context) {
    let n = ctx.validation_errors();
    assert_eq!(
        n, 0,
        "{n} Vulkan validation error(s); see the log (OCTOFLOW_LOG=vulkan=warn)"
    );
}
