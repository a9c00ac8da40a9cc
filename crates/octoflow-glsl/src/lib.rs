//! Build-time GLSL → SPIR-V for OctoFlow's build scripts (no shader compiler at run time).
//!
//! [`build_shader_dir`] compiles every `*.comp` of a folder with glslang (Vulkan 1.2, SPIR-V 1.5;
//! `GL_KHR_cooperative_matrix`, `GL_KHR_shader_subgroup_*`, 8/16-bit types all compile under it),
//! writes the `.spv` files to `OUT_DIR` and generates a Rust module that embeds them with
//! `include_bytes!`: one `pub const NAME: Shader` per variant plus `pub const ALL: &[Shader]`.
//!
//! Variants come from `variants.txt` in the folder; see [`variants`] for its format. The
//! compiler is behind the `compile` feature, which build scripts enable.

#[cfg(feature = "compile")]
mod compile;
pub mod variants;

#[cfg(feature = "compile")]
use std::fmt::Write as _;
#[cfg(feature = "compile")]
use std::path::Path;

pub use variants::Variant;

/// Compiles the `*.comp` files of `shader_dir` and its subfolders (with `#include "x.glsl"`
/// resolved in `shader_dir`) into `out_dir/<variant>.spv` and writes `out_dir/<module_file>`,
/// whose constants have type `shader_type` (a path such as `octoflow_vk::Shader`, a struct with
/// `name: &'static str` and `spirv: &'static [u8]`). Variants tagged `@feature` are built only
/// when the build script runs with that cargo feature (`CARGO_FEATURE_<FEATURE>`). Prints
/// `cargo:rerun-if-changed` for the folders and each file. Returns the variants built; the
/// error is the compiler log of the first shader that failed.
#[cfg(feature = "compile")]
pub fn build_shader_dir(
    shader_dir: &Path,
    out_dir: &Path,
    module_file: &str,
    shader_type: &str,
) -> Result<Vec<Variant>, String> {
    println!("cargo:rerun-if-changed={}", shader_dir.display());
    let sources = list_sources(shader_dir)?;
    let list = shader_dir.join("variants.txt");
    let text = match std::fs::read_to_string(&list) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", list.display())),
    };
    let variants: Vec<Variant> = variants::plan(&text, &sources)?
        .into_iter()
        .filter(|v| v.feature.as_deref().is_none_or(feature_on))
        .collect();

    let mut module = format!(
        "// Generated from {} by octoflow-glsl; do not edit.\n\n",
        shader_dir.display()
    );
    let mut table = String::new();
    for v in &variants {
        let words = compile::compile(shader_dir, v)?;
        let spv = out_dir.join(format!("{}.spv", v.output));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        std::fs::write(&spv, bytes).map_err(|e| format!("{}: {e}", spv.display()))?;
        let konst = v.output.to_uppercase();
        let _ = writeln!(
            module,
            "/// `{}` built from `{}` with defines {}.\npub const {konst}: {shader_type} = \
             {shader_type} {{ name: {:?}, spirv: include_bytes!({:?}) }};",
            v.output,
            v.source,
            v.describe_defines(),
            v.output,
            spv.display().to_string(),
        );
        let _ = writeln!(table, "    {konst},");
    }
    let _ = writeln!(module, "\n/// Every shader variant, in build order.\npub const ALL: &[{shader_type}] = &[\n{table}];");
    let path = out_dir.join(module_file);
    std::fs::write(&path, module).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(variants)
}

/// Whether the crate being built has cargo feature `name` on.
#[cfg(feature = "compile")]
fn feature_on(name: &str) -> bool {
    let var = format!("CARGO_FEATURE_{}", name.to_uppercase().replace('-', "_"));
    std::env::var_os(var).is_some()
}

/// Paths (relative to `dir`, `/`-separated) of the `.comp` files in `dir` and its subfolders,
/// sorted; registers every file and folder for rebuilds.
#[cfg(feature = "compile")]
fn list_sources(dir: &Path) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    collect_sources(dir, "", &mut names)?;
    names.sort();
    Ok(names)
}

#[cfg(feature = "compile")]
fn collect_sources(dir: &Path, prefix: &str, names: &mut Vec<String>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        println!("cargo:rerun-if-changed={}", path.display());
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if path.is_dir() {
            collect_sources(&path, &format!("{prefix}{name}/"), names)?;
        } else if name.ends_with(".comp") {
            names.push(format!("{prefix}{name}"));
        }
    }
    Ok(())
}
