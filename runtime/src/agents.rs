//! Reading the agents' folder: every `*.toml` file but the scripted model's turns
//! (`*.script.toml`), in name order, made into a [`Catalog`] by the model's rules.

use countersign_model::agent::{AgentError, Catalog, SCRIPT_SUFFIX};
use std::path::{Path, PathBuf};

/// Loads every agent of `dir`.
pub fn load_dir(dir: &Path) -> Result<Catalog, AgentError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |error| AgentError::Read { path, error }
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".toml") && !name.ends_with(SCRIPT_SUFFIX)
        })
        .collect();
    paths.sort();
    let files = paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
            Ok((path, text))
        })
        .collect::<Result<Vec<_>, AgentError>>()?;
    Catalog::from_files(dir, files)
}
