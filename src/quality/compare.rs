//! How close an answer is to its baseline, in 0..1: pure, no I/O.
//!
//! The status and (when the capability declares one) the output schema are a gate: an answer
//! that fails either scores 0. Past the gate, each `json_fields` pointer is equal to the
//! baseline's or not (the field score is the share that are), and `text_field` is scored by
//! token-set Jaccard similarity. The task's similarity is the mean of the parts it compares.
//!
//! Why token-set Jaccard for text: a model's answer to the same prompt is rarely the same string
//! twice, but a healthy one keeps its vocabulary — it is order-insensitive, robust to a few words
//! rephrased, linear in the text's length, and falls fast when the answer is about something
//! else or in another language. Why a mean and not a product: each compared part counts for its
//! share, so "one field of two changed" reads as 0.5 and the threshold means "how much of the
//! answer still matches"; a product would let one part zero the rest.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::config::{Compare, CompiledSchema};

/// One answer against its baseline.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Compared {
    /// 0..1.
    pub(crate) similarity: f64,
    /// What differs: the `json_fields` pointers that are not equal, the `text_field` when its
    /// text is not the same, or the gate that failed (`status 500`, `schema: /title: …`).
    pub(crate) differing: Vec<String>,
}

impl Compared {
    fn gate(why: String) -> Self {
        Self {
            similarity: 0.0,
            differing: vec![why],
        }
    }
}

/// Compares `answer` (the body the agent gave with `status`) with `baseline` (the recorded body).
pub(crate) fn compare(
    compare: &Compare,
    schema: Option<&CompiledSchema>,
    status: u16,
    answer: &str,
    baseline: &str,
) -> Compared {
    if !(200..300).contains(&status) {
        return Compared::gate(format!("status {status}"));
    }
    let needs_json =
        schema.is_some() || !compare.json_fields.is_empty() || compare.text_field.is_some();
    if !needs_json {
        let similarity = jaccard(answer, baseline);
        let differing = if similarity < 1.0 {
            vec!["body".to_owned()]
        } else {
            Vec::new()
        };
        return Compared {
            similarity,
            differing,
        };
    }
    let Ok(got) = serde_json::from_str::<Value>(answer) else {
        return Compared::gate("not JSON".to_owned());
    };
    if let Some(schema) = schema {
        if let Err(errors) = schema.check(&got) {
            return Compared::gate(format!("schema: {}", errors.join("; ")));
        }
    }
    // An unreadable baseline matches nothing: every compared part differs.
    let want = serde_json::from_str::<Value>(baseline).unwrap_or(Value::Null);
    let mut differing = Vec::new();
    let mut parts = Vec::new();
    if !compare.json_fields.is_empty() {
        let mut equal = 0usize;
        for pointer in &compare.json_fields {
            if got.pointer(pointer) == want.pointer(pointer) {
                equal += 1;
            } else {
                differing.push(pointer.clone());
            }
        }
        parts.push(equal as f64 / compare.json_fields.len() as f64);
    }
    if let Some(pointer) = &compare.text_field {
        let text = |v: &Value| v.pointer(pointer).map(as_text).unwrap_or_default();
        let score = jaccard(&text(&got), &text(&want));
        if score < 1.0 {
            differing.push(pointer.clone());
        }
        parts.push(score);
    }
    let similarity = if parts.is_empty() {
        // Only the schema was asked for, and it passed.
        1.0
    } else {
        parts.iter().sum::<f64>() / parts.len() as f64
    };
    Compared {
        similarity,
        differing,
    }
}

/// A JSON value as text: a string as it is, anything else as JSON.
fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Lower-cased alphanumeric words.
fn tokens(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Token-set Jaccard similarity: shared words over all words. Two empty texts are the same.
pub(crate) fn jaccard(a: &str, b: &str) -> f64 {
    let (a, b) = (tokens(a), tokens(b));
    let union = a.union(&b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}

/// The run's similarity: the mean over its tasks (1 for no tasks: nothing drifted).
pub(crate) fn mean(similarities: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = similarities
        .into_iter()
        .fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        1.0
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Compare {
        Compare {
            json_fields: vec!["/title".into(), "/language".into()],
            text_field: Some("/summary".into()),
        }
    }

    const BASE: &str =
        r#"{"title":"Q3","language":"en","summary":"Revenue grew nine percent on cloud demand"}"#;

    #[test]
    fn the_same_answer_is_one_and_order_or_case_does_not_matter() {
        assert_eq!(compare(&fields(), None, 200, BASE, BASE).similarity, 1.0);
        let reordered = r#"{"language":"en","title":"Q3","summary":"on cloud demand, revenue grew nine percent"}"#;
        let c = compare(&fields(), None, 200, reordered, BASE);
        assert_eq!((c.similarity, c.differing.len()), (1.0, 0));
    }

    #[test]
    fn a_changed_field_and_a_diverging_text_each_count_for_their_share() {
        let drift = r#"{"title":"Q3","language":"fr","summary":"Sorry, I cannot help with that"}"#;
        let c = compare(&fields(), None, 200, drift, BASE);
        // Fields: 1 of 2 equal; text: no shared word.
        assert!((c.similarity - 0.25).abs() < 1e-9, "{c:?}");
        assert_eq!(
            c.differing,
            vec!["/language".to_owned(), "/summary".to_owned()]
        );
        let rephrased = r#"{"title":"Q3","language":"en","summary":"Revenue grew ten percent on cloud demand"}"#;
        let c = compare(&fields(), None, 200, rephrased, BASE);
        // 6 shared of 8 words: (1 + 0.75) / 2.
        assert!((c.similarity - 0.875).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn status_and_schema_are_a_gate() {
        assert_eq!(compare(&fields(), None, 500, BASE, BASE).similarity, 0.0);
        assert_eq!(
            compare(&fields(), None, 200, "<html>", BASE).differing,
            vec!["not JSON"]
        );
        let schema = CompiledSchema::compile(&serde_json::json!({"required": ["ok"]}));
        let Ok(schema) = schema else {
            panic!("schema compiles")
        };
        let c = compare(&fields(), Some(&schema), 200, BASE, BASE);
        assert_eq!(c.similarity, 0.0);
        assert!(c.differing[0].starts_with("schema: "), "{c:?}");
    }

    #[test]
    fn without_compare_keys_the_whole_body_is_text_and_a_run_is_the_mean() {
        let c = compare(&Compare::default(), None, 200, "a b c d", "a b c e");
        assert!((c.similarity - 0.6).abs() < 1e-9);
        assert_eq!(jaccard("", ""), 1.0);
        assert_eq!(mean([1.0, 0.5]), 0.75);
        assert_eq!(mean([]), 1.0);
    }
}
