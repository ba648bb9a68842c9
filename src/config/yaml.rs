//! The one place YAML is parsed and written. serde_yaml is deprecated upstream; swapping in a
//! maintained fork (serde_yaml_ng, serde_norway) touches only this file (tests/it/layout.rs holds
//! every other file of `src/` to it). The `pub` part is for the injector, the tests and the
//! benchmarks, which read and write Kubernetes manifests.

use std::path::Path;

use serde::de::{DeserializeOwned, DeserializeSeed};
use serde::Serialize;

/// Why a YAML text could not be read or a value written; says where in the text.
pub(crate) use serde_yaml::Error;
#[cfg(test)]
pub(crate) use serde_yaml::{Mapping, Value};

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

/// One YAML document as `T` (no file to name in errors: for manifests, tests and tools).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_yaml::from_str(text)
}

/// [`from_str`] of bytes (a tool's output).
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    serde_yaml::from_slice(bytes)
}

/// Every document of a multi-document stream (`---` between them), in order, each as `T`.
pub(crate) fn documents<'t, T: DeserializeOwned + 't>(
    text: &'t str,
) -> impl Iterator<Item = Result<T, Error>> + 't {
    serde_yaml::Deserializer::from_str(text).map(T::deserialize)
}

/// `value` as a YAML document.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_yaml::to_string(value)
}

/// `value` as a YAML tree.
#[cfg(test)]
pub(crate) fn to_value<T: Serialize>(value: T) -> Result<Value, Error> {
    serde_yaml::to_value(value)
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::config::HumanDuration;

    proptest! {
        /// A config value written as YAML reads back the same (durations have their own text
        /// form, `1m30s`); here rather than in `duration.rs`, which `bounds` (imported above)
        /// uses.
        #[test]
        fn human_durations_round_trip_through_yaml(ms in 0..=365 * 86_400_000u64) {
            let d = HumanDuration::from_millis(ms);
            let text = to_string(&d).unwrap_or_default();
            let back: Result<HumanDuration, _> = from_str(&text);
            prop_assert_eq!(back.ok(), Some(d));
        }
    }
}
