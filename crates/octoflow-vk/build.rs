//! Compiles the runtime's own test shaders (`test_shaders/*.comp`) into `$OUT_DIR/test_shaders.rs`,
//! included only by the unit tests.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    let dir = Path::new(&manifest).join("test_shaders");
    if let Err(e) =
        octoflow_glsl::build_shader_dir(&dir, &out_dir, "test_shaders.rs", "crate::Shader")
    {
        eprintln!("test shader build failed:\n{e}");
        std::process::exit(1);
    }
}
