//! The one place YAML is parsed. serde_yaml is deprecated upstream; swapping in a maintained fork
//! (serde_yaml_ng, serde_norway) touches only this file.

use std::path::Path;

use serde::de::{DeserializeOwned, DeserializeSeed};

use super::bounds::{Row, Walk};
use super::ConfigError;

/// Parses `text` strictly into `T`; errors carry the file, line and column.
pub(crate) fn parse<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    // An empty document (or one holding only comments) means "all defaults".
    let text = if is_empty_document(text) { "{}" } else { text };
    serde_yaml::from_str(text).map_err(|e| invalid(path, &e))
}

/// [`parse`], after a walk that checks every value against `rules` (and refuses empty values)
/// where it is written.
pub(crate) fn parse_checked<T: DeserializeOwned>(
    path: &Path,
    text: &str,
    rules: &[Row],
) -> Result<T, ConfigError> {
    if !is_empty_document(text) {
        let walk = Walk {
            rules,
            path: String::new(),
        };
        walk.deserialize(serde_yaml::Deserializer::from_str(text))
            .map_err(|e| invalid(path, &e))?;
    }
    parse(path, text)
}

/// The top-level keys of a mapping document, used to tell a bootstrap file from a policy file.
pub(crate) fn top_level_keys(path: &Path, text: &str) -> Result<Vec<String>, ConfigError> {
    if is_empty_document(text) {
        return Ok(Vec::new());
    }
    let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| invalid(path, &e))?;
    match value {
        serde_yaml::Value::Mapping(map) => Ok(map
            .keys()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect()),
        _ => Err(ConfigError::Invalid {
            path: path.display().to_string(),
            line: 1,
            column: 1,
            message: "the document must be a mapping of keys to values".to_owned(),
        }),
    }
}

/// Where `needle` first appears in `text` (1-based line and column), for an error found after
/// the parse; the document's start when it does not.
pub(crate) fn locate(text: &str, needle: &str) -> (usize, usize) {
    text.lines()
        .enumerate()
        .find_map(|(i, line)| line.find(needle).map(|c| (i + 1, c + 1)))
        .unwrap_or((1, 1))
}

fn is_empty_document(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    })
}

fn invalid(path: &Path, err: &serde_yaml::Error) -> ConfigError {
    let (line, column) = err
        .location()
        .map(|l| (l.line(), l.column()))
        .unwrap_or((1, 1));
    // serde_yaml appends " at line L column C" to its message; we print the location up front.
    let message = err.to_string();
    let message = match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message,
    };
    ConfigError::Invalid {
        path: path.display().to_string(),
        line,
        column,
        message,
    }
}
