//! Compiles `shaders/*.comp` (variants from `shaders/variants.txt`) to SPIR-V at build time and
//! generates `$OUT_DIR/shaders.rs`, which `src/lib.rs` includes as the `shaders` module.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default());
    let dir = Path::new(&manifest).join("shaders");
    if let Err(e) =
        octoflow_glsl::build_shader_dir(&dir, &out_dir, "shaders.rs", "octoflow_vk::Shader")
    {
        eprintln!("shader build failed:\n{e}");
        std::process::exit(1);
    }
}
