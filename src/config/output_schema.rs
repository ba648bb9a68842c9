//! A capability's `output_schema`: the JSON Schema its agent's answers must match, written inline
//! or in a file beside the bootstrap, compiled once when the file is loaded and shared by every
//! request (`docs/reach-model.md`, "Output validation").
//!
//! Compiled without remote references: a `$ref` to a URL or a file fails at load, so a schema
//! never makes the sidecar fetch anything on its own and a reload is as fast as a parse.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// How many validation errors an answer reports, and how long each may be: a caller gets enough
/// to see what was wrong, never a copy of a huge body.
const MAX_ERRORS: usize = 3;
const MAX_ERROR_CHARS: usize = 200;

/// `output_schema:` as written, and the schema it names, compiled.
#[derive(Clone)]
pub struct OutputSchema {
    source: SchemaSource,
    /// Set when the schema is known: at once for an inline one, when the bootstrap is parsed for
    /// a file (`parse_bootstrap` resolves it beside the bootstrap).
    compiled: Option<Arc<CompiledSchema>>,
}

/// Where the schema is written.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SchemaSource {
    /// The schema itself (a mapping, or `true`/`false`).
    Inline(serde_json::Value),
    /// A JSON or YAML file, relative to the bootstrap file.
    File(PathBuf),
}

/// A schema ready to check answers with.
pub struct CompiledSchema {
    validator: jsonschema::Validator,
    /// SHA-256 of the schema's compact JSON text: what gossip carries, so an operator sees which
    /// agents validate against which schema.
    digest: [u8; 32],
}

impl OutputSchema {
    /// An inline schema, compiled now.
    pub fn inline(schema: serde_json::Value) -> Result<Self, String> {
        let compiled = CompiledSchema::compile(&schema)?;
        Ok(Self {
            source: SchemaSource::Inline(schema),
            compiled: Some(Arc::new(compiled)),
        })
    }

    pub(crate) fn source(&self) -> &SchemaSource {
        &self.source
    }

    /// The compiled schema; `None` only for a file not yet resolved.
    pub fn compiled(&self) -> Option<&Arc<CompiledSchema>> {
        self.compiled.as_ref()
    }

    /// Reads and compiles a file schema (an inline one is compiled already).
    pub(super) fn resolve(&mut self, base: Option<&Path>) -> Result<(), String> {
        let SchemaSource::File(path) = &self.source else {
            return Ok(());
        };
        let full = match base {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.clone(),
        };
        let text = std::fs::read_to_string(&full)
            .map_err(|e| format!("cannot read schema file {}: {e}", full.display()))?;
        // YAML is a superset of JSON: one parser reads both.
        let schema: serde_json::Value = super::yaml::from_str(&text)
            .map_err(|e| format!("schema file {}: not JSON or YAML: {e}", full.display()))?;
        let compiled = CompiledSchema::compile(&schema)
            .map_err(|e| format!("schema file {}: {e}", full.display()))?;
        self.compiled = Some(Arc::new(compiled));
        Ok(())
    }
}

impl CompiledSchema {
    pub(crate) fn compile(schema: &serde_json::Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(schema)
            .map_err(|e| format!("not a valid JSON Schema: {}", bounded(&e.to_string())))?;
        let text = serde_json::to_string(schema).unwrap_or_default();
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        Ok(Self {
            validator,
            digest: bytes,
        })
    }

    pub fn digest(&self) -> SchemaDigest {
        SchemaDigest(self.digest)
    }

    /// Checks one answer: the first few errors (where, and what), when it does not match.
    pub(crate) fn check(&self, answer: &serde_json::Value) -> Result<(), Vec<String>> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(answer)
            .take(MAX_ERRORS)
            .map(|e| {
                let at = e.instance_path().as_str();
                let at = if at.is_empty() { "/" } else { at };
                bounded(&format!("{at}: {e}"))
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// A schema's SHA-256, as profiles publish it: `sha256:<hex>` in JSON (`/reach/v1/self`,
/// `/status`), 32 bytes on the gossip wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SchemaDigest(pub(crate) [u8; 32]);

impl fmt::Debug for SchemaDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&digest_label(&self.0))
    }
}

impl fmt::Display for SchemaDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&digest_label(&self.0))
    }
}

impl SchemaDigest {
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(out))
    }
}

impl Serialize for SchemaDigest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SchemaDigest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).ok_or_else(|| de::Error::custom("not a `sha256:<64 hex digits>` digest"))
    }
}

/// `sha256:<hex>`: how a schema's digest is shown.
fn digest_label(digest: &[u8; 32]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// `text` cut to a bounded length on a char boundary.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_ERROR_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

impl fmt::Debug for OutputSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputSchema")
            .field("source", &self.source)
            .field("compiled", &self.compiled.is_some())
            .finish()
    }
}

impl fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&digest_label(&self.digest))
    }
}

/// Same source and, once compiled, the same schema: a file whose content changed is a change.
impl PartialEq for OutputSchema {
    fn eq(&self, other: &Self) -> bool {
        let digest = |s: &Self| s.compiled.as_ref().map(|c| c.digest);
        self.source == other.source && digest(self) == digest(other)
    }
}

impl Serialize for OutputSchema {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.source {
            SchemaSource::Inline(schema) => schema.serialize(s),
            SchemaSource::File(path) => path.serialize(s),
        }
    }
}

/// A string is a file's path; anything else is the schema, compiled here so a bad one is
/// reported where it is written.
impl<'de> Deserialize<'de> for OutputSchema {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(path) if path.trim().is_empty() => Err(de::Error::custom(
                "an empty schema path: give a file, or the schema itself",
            )),
            serde_json::Value::String(path) => Ok(Self {
                source: SchemaSource::File(PathBuf::from(path)),
                compiled: None,
            }),
            // serde places the error at the capability: name the key.
            schema => {
                Self::inline(schema).map_err(|e| de::Error::custom(format!("output_schema: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> CompiledSchema {
        let s = json!({"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}});
        CompiledSchema::compile(&s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_answer_is_checked_with_where_and_what() {
        let s = schema();
        assert_eq!(s.check(&json!({"ok": true})), Ok(()));
        let errors = s.check(&json!({"agent": "a"})).err().unwrap_or_default();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("/: "), "{errors:?}");
        assert!(
            errors[0].contains("\"ok\" is a required property"),
            "{errors:?}"
        );
        let errors = s.check(&json!({"ok": "yes"})).err().unwrap_or_default();
        assert!(errors[0].starts_with("/ok: "), "{errors:?}");
    }

    #[test]
    fn errors_are_few_and_short() {
        let many = json!({"type": "array", "items": {"type": "integer"}});
        let s = CompiledSchema::compile(&many).unwrap_or_else(|e| panic!("{e}"));
        let long = "x".repeat(10_000);
        let errors = s
            .check(&json!([long, "a", "b", "c", "d"]))
            .err()
            .unwrap_or_default();
        assert_eq!(errors.len(), MAX_ERRORS);
        assert!(errors
            .iter()
            .all(|e| e.chars().count() <= MAX_ERROR_CHARS + 1));
    }

    #[test]
    fn a_bad_schema_or_a_remote_ref_does_not_compile() {
        let bad = CompiledSchema::compile(&json!({"type": "no-such-type"}));
        assert!(bad.is_err());
        let remote = CompiledSchema::compile(&json!({"$ref": "https://example.com/s.json"}));
        assert!(remote.is_err(), "no remote fetching");
    }

    #[test]
    fn the_digest_is_of_the_compact_text() {
        let a = schema();
        let b = schema();
        assert_eq!(a.digest(), b.digest());
        let label = a.digest().to_string();
        assert!(
            label.starts_with("sha256:") && label.len() == 7 + 64,
            "{label}"
        );
        assert_eq!(SchemaDigest::parse(&label), Some(a.digest()));
        assert_eq!(SchemaDigest::parse("sha256:zz"), None);
        let other = CompiledSchema::compile(&json!({"type": "object"}));
        assert_ne!(other.map(|o| o.digest()).ok(), Some(a.digest()));
    }
}
