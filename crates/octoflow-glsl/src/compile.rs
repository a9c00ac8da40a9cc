//! One variant through glslang.

use std::path::Path;

use glslang::include::{IncludeHandler, IncludeResult, IncludeType};
use glslang::{
    Compiler, CompilerOptions, ShaderInput, ShaderSource, ShaderStage, SourceLanguage,
    SpirvVersion, Target, VulkanVersion,
};

use crate::variants::Variant;

/// Resolves `#include "name"` to `name` in the source's own folder if there is one, else in
/// the shader folder (where the headers several families share live).
struct Includer<'a> {
    own: &'a Path,
    root: &'a Path,
}

impl IncludeHandler for Includer<'_> {
    fn include(&mut self, _: IncludeType, name: &str, _: &str, _: usize) -> Option<IncludeResult> {
        let own = self.own.join(name);
        let path = if own.is_file() {
            own
        } else {
            self.root.join(name)
        };
        let data = std::fs::read_to_string(&path).ok()?;
        Some(IncludeResult {
            name: path.display().to_string(),
            data,
        })
    }
}

/// Compiles `v` to SPIR-V words; the error carries glslang's log.
pub(crate) fn compile(dir: &Path, v: &Variant) -> Result<Vec<u32>, String> {
    let what = |e: &dyn std::fmt::Display| {
        format!(
            "{} ({} with {}): {e}",
            v.output,
            v.source,
            v.describe_defines()
        )
    };
    let compiler = Compiler::acquire().ok_or("glslang failed to initialize")?;
    let path = dir.join(&v.source);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let source = ShaderSource::from(text);
    let options = CompilerOptions {
        source_language: SourceLanguage::GLSL,
        // Vulkan 1.2 / SPIR-V 1.5 is the runtime's floor; subgroup ops, 8/16-bit types, integer
        // dot product and cooperative matrices compile under it as extensions.
        target: Target::Vulkan {
            version: VulkanVersion::Vulkan1_2,
            spirv_version: SpirvVersion::SPIRV1_5,
        },
        ..CompilerOptions::default()
    };
    let defines: Vec<(&str, Option<&str>)> = v
        .defines
        .iter()
        .map(|(k, val)| (k.as_str(), val.as_deref()))
        .collect();
    let mut includer = Includer {
        own: path.parent().unwrap_or(dir),
        root: dir,
    };
    let input = ShaderInput::new(
        &source,
        ShaderStage::Compute,
        &options,
        Some(&defines),
        Some(&mut includer),
    )
    .map_err(|e| what(&e))?;
    let shader = compiler.create_shader(input).map_err(|e| what(&e))?;
    shader.compile().map_err(|e| what(&e))
}
