//! The variant table: which SPIR-V modules to build from which source with which defines.
//!
//! `variants.txt` has one variant per line, `<output> <source.comp> [NAME=VALUE | NAME]...
//! [@feature]`; `#` starts a comment. Sources are paths relative to the shader folder
//! (`linear/matvec.comp`). A source named there is built only as its listed variants; every
//! other `.comp` is built once, without defines, under its file stem. Output names are unique
//! snake_case (they become Rust constants in upper case). A variant tagged `@feature` is built
//! only when the crate's cargo feature `feature` is on (benchmark-only ablations stay out of
//! the product).
//!
//! ```text
//! # output             source                  defines
//! matvec_q4_0_sg32     linear/matvec.comp      QTYPE=Q4_0 SUBGROUP=32
//! matvec_q4_0_sg8      linear/matvec.comp      QTYPE=Q4_0 SUBGROUP=8
//! matvec_q4_0_noload   linear/matvec.comp      QTYPE=Q4_0 ABL_NOLOAD @bench
//! ```

/// One SPIR-V module to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// Output name: the `.spv` file stem and the constant's name.
    pub output: String,
    /// Source file name in the shader folder.
    pub source: String,
    /// Preprocessor defines, `(name, value)`.
    pub defines: Vec<(String, Option<String>)>,
    /// The cargo feature the variant is built under (`@feature`), if any.
    pub feature: Option<String>,
}

impl Variant {
    /// Defines as `A=1 B`, or `none`.
    pub fn describe_defines(&self) -> String {
        if self.defines.is_empty() {
            return "none".into();
        }
        let parts: Vec<String> = self
            .defines
            .iter()
            .map(|(k, v)| match v {
                Some(v) => format!("`{k}={v}`"),
                None => format!("`{k}`"),
            })
            .collect();
        parts.join(" ")
    }
}

/// Plans the variants from the table `text` and the folder's `sources` (`.comp` file names).
pub fn plan(text: &str, sources: &[String]) -> Result<Vec<Variant>, String> {
    let mut variants = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(output), Some(source)) = (fields.next(), fields.next()) else {
            return Err(format!(
                "variants.txt line {}: expected `<output> <source.comp> [DEFINES]`, found {line:?}",
                n + 1
            ));
        };
        if !sources.iter().any(|s| s == source) {
            return Err(format!(
                "variants.txt line {}: no shader file {source:?}",
                n + 1
            ));
        }
        let mut defines = Vec::new();
        let mut feature = None;
        for d in fields {
            if let Some(f) = d.strip_prefix('@') {
                if f.is_empty() || feature.replace(f.to_string()).is_some() {
                    return Err(format!(
                        "variants.txt line {}: at most one `@feature` tag, found {line:?}",
                        n + 1
                    ));
                }
                continue;
            }
            defines.push(match d.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (d.to_string(), None),
            });
        }
        variants.push(Variant {
            output: output.into(),
            source: source.into(),
            defines,
            feature,
        });
    }
    for source in sources {
        if !variants.iter().any(|v| &v.source == source) {
            let file = source.rsplit('/').next().unwrap_or(source);
            let stem = file.trim_end_matches(".comp").to_string();
            variants.push(Variant {
                output: stem,
                source: source.clone(),
                defines: vec![],
                feature: None,
            });
        }
    }
    check_names(&variants)?;
    Ok(variants)
}

fn check_names(variants: &[Variant]) -> Result<(), String> {
    for (i, v) in variants.iter().enumerate() {
        let snake = !v.output.is_empty()
            && v.output.starts_with(|c: char| c.is_ascii_lowercase())
            && v.output
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !snake {
            return Err(format!(
                "variant name {:?} (from {}) must be snake_case",
                v.output, v.source
            ));
        }
        if variants[..i].iter().any(|w| w.output == v.output) {
            return Err(format!("variant name {:?} is defined twice", v.output));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources() -> Vec<String> {
        vec![
            "add.comp".into(),
            "matvec.comp".into(),
            "train/gemm.comp".into(),
        ]
    }

    #[test]
    fn listed_sources_build_only_their_variants_and_others_build_once() {
        let text = "# comment\nmatvec_q4_0 matvec.comp QTYPE=Q4_0 USE_SUBGROUPS # trailing\n\n";
        let v = plan(text, &sources()).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].output, "matvec_q4_0");
        assert_eq!(
            v[0].defines,
            vec![
                ("QTYPE".into(), Some("Q4_0".into())),
                ("USE_SUBGROUPS".into(), None)
            ]
        );
        assert_eq!(
            (v[1].output.as_str(), v[1].source.as_str()),
            ("add", "add.comp")
        );
        assert!(v[1].defines.is_empty());
        // a source in a subfolder is named by its path and built under its file stem
        assert_eq!(
            (v[2].output.as_str(), v[2].source.as_str()),
            ("gemm", "train/gemm.comp")
        );
    }

    #[test]
    fn a_feature_tag_names_the_feature_and_is_not_a_define() {
        let v = plan("add_x add.comp ABL @bench X=1", &sources()).unwrap();
        assert_eq!(v[0].feature.as_deref(), Some("bench"));
        assert_eq!(
            v[0].defines,
            vec![("ABL".into(), None), ("X".into(), Some("1".into()))]
        );
        assert_eq!(v[1].feature, None);
        let err = plan("add_x add.comp @a @b", &sources()).unwrap_err();
        assert!(err.contains("at most one"), "{err}");
    }

    #[test]
    fn unknown_source_is_a_clear_error() {
        let err = plan("x nothere.comp", &sources()).unwrap_err();
        assert!(
            err.contains("line 1") && err.contains("nothere.comp"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_or_non_snake_names_are_rejected() {
        let err = plan("a add.comp\na add.comp X=1", &sources()).unwrap_err();
        assert!(err.contains("twice"), "{err}");
        let err = plan("Add add.comp", &sources()).unwrap_err();
        assert!(err.contains("snake_case"), "{err}");
        let err = plan("lonely", &sources()).unwrap_err();
        assert!(err.contains("expected"), "{err}");
    }
}
