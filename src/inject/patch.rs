//! RFC 6902 JSON patch: the operations the webhook answers with, and applying them (manual
//! injection with `agent-reach inject --file`, and tests that check the patched pod).

use serde::Serialize;
use serde_json::Value;

/// One operation; the webhook only ever adds or replaces.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Op {
    pub op: &'static str,
    pub path: String,
    pub value: Value,
}

impl Op {
    pub(crate) fn add(path: String, value: Value) -> Self {
        Self {
            op: "add",
            path,
            value,
        }
    }

    pub(crate) fn replace(path: String, value: Value) -> Self {
        Self {
            op: "replace",
            path,
            value,
        }
    }
}

/// A map key as one JSON-pointer token (`agent-reach.io/status` → `agent-reach.io~1status`).
pub(crate) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("cannot apply {op} at {path}: {problem}")]
pub struct PatchError {
    pub(crate) op: &'static str,
    pub(crate) path: String,
    pub(crate) problem: &'static str,
}

/// Applies `ops` in order, as the API server would.
pub fn apply(doc: &mut Value, ops: &[Op]) -> Result<(), PatchError> {
    for op in ops {
        let fail = |problem| PatchError {
            op: op.op,
            path: op.path.clone(),
            problem,
        };
        let (parent, last) = match op.path.rfind('/') {
            Some(i) => (&op.path[..i], unescape(&op.path[i + 1..])),
            None => return Err(fail("the path does not start with `/`")),
        };
        let target = doc
            .pointer_mut(parent)
            .ok_or_else(|| fail("the parent does not exist"))?;
        match target {
            Value::Object(map) => {
                if op.op == "replace" && !map.contains_key(&last) {
                    return Err(fail("nothing to replace"));
                }
                map.insert(last, op.value.clone());
            }
            Value::Array(list) => {
                let index = if last == "-" {
                    list.len()
                } else {
                    last.parse::<usize>().map_err(|_| fail("not an index"))?
                };
                match op.op {
                    "add" if index <= list.len() => list.insert(index, op.value.clone()),
                    "replace" if index < list.len() => list[index] = op.value.clone(),
                    _ => return Err(fail("index out of range")),
                }
            }
            _ => return Err(fail("the parent is not an object or an array")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn adds_insert_append_and_escape_keys() {
        let mut doc = json!({ "metadata": { "annotations": {} }, "spec": { "c": [1, 2] } });
        let ops = vec![
            Op::add("/spec/c/0".into(), json!(0)),
            Op::add("/spec/c/-".into(), json!(3)),
            Op::add(
                format!("/metadata/annotations/{}", escape("a.io/b~c")),
                json!("x"),
            ),
            Op::replace("/spec/c/1".into(), json!(10)),
        ];
        assert_eq!(apply(&mut doc, &ops), Ok(()));
        assert_eq!(doc["spec"]["c"], json!([0, 10, 2, 3]));
        assert_eq!(doc["metadata"]["annotations"]["a.io/b~c"], json!("x"));
    }

    #[test]
    fn a_missing_parent_or_bad_index_is_an_error_not_a_panic() {
        let mut doc = json!({ "spec": { "c": [] } });
        assert!(apply(&mut doc, &[Op::add("/nope/x".into(), json!(1))]).is_err());
        assert!(apply(&mut doc, &[Op::add("/spec/c/5".into(), json!(1))]).is_err());
        assert!(apply(&mut doc, &[Op::replace("/spec/d".into(), json!(1))]).is_err());
        assert!(apply(&mut doc, &[Op::add("x".into(), json!(1))]).is_err());
    }
}
