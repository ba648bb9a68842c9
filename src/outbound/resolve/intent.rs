//! Intent routing: the capability a call asks for in words (`any.reach`, `reach-intent`), picked
//! by the policy's keyword rules. Pure: text in, a capability and why (or a refusal naming the
//! candidates) out. The rules and the definition of confidence: `docs/intents.md`.

use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::Bytes;
use http::HeaderValue;

use crate::config::{fold_padded, Intents, Keyword, Name};
use crate::error::ReachError;

/// How much of a body is read for its intent: enough for any prompt's opening, bounded per call.
pub(in crate::outbound) const MAX_TEXT: usize = 16 * 1024;

/// The capability an intent resolved to, and why.
#[derive(Debug, PartialEq)]
pub(in crate::outbound) struct Resolved<'a> {
    pub(in crate::outbound) capability: &'a Name,
    /// The winning rule's longest keyword found in the text (folded).
    pub(in crate::outbound) keyword: &'a str,
    /// The winner's keyword length over the sum of every matched rule's longest keyword length.
    pub(in crate::outbound) confidence: f64,
}

impl Resolved<'_> {
    /// `reach-resolved-capability: data-fetch; by=intent; keyword="crawl"; confidence=1.00`.
    pub(in crate::outbound) fn header(&self) -> HeaderValue {
        let mut text = format!("{}; by=intent; keyword=\"", self.capability);
        // Keywords are letters, digits and spaces: only non-ASCII needs escaping for a header.
        for c in self.keyword.chars() {
            if c.is_ascii() {
                text.push(c);
            } else {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(text, "%{b:02X}");
                }
            }
        }
        let _ = write!(text, "\"; confidence={:.2}", self.confidence);
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("-; by=intent"))
    }
}

/// `reach-resolved-capability` for a call that asked for intent routing but named its
/// capability too: the name wins.
pub(in crate::outbound) fn overridden(capability: &Name) -> HeaderValue {
    HeaderValue::from_str(&format!("{capability}; by=override"))
        .unwrap_or_else(|_| HeaderValue::from_static("-; by=override"))
}

/// Picks the capability `text` asks for: the rule owning the longest matched keyword, when no
/// other rule matched one as long and its confidence reaches `threshold`.
pub(in crate::outbound) fn resolve<'a>(
    intents: &'a Intents,
    threshold: f64,
    text: &str,
) -> Result<Resolved<'a>, ReachError> {
    let folded = fold_padded(text);
    // Each rule's longest keyword in the text: keywords come longest first, so the first found
    // for a rule is its best, and a rule already found is not searched again.
    let mut best: Vec<Option<&Keyword>> = vec![None; intents.rules().len()];
    for keyword in intents.keywords() {
        if let Some(slot @ None) = best.get_mut(keyword.rule) {
            if keyword.occurs_in(&folded) {
                *slot = Some(keyword);
            }
        }
    }
    let mut matched: Vec<&Keyword> = best.into_iter().flatten().collect();
    matched.sort_by(|a, b| b.len.cmp(&a.len).then(a.rule.cmp(&b.rule)));
    let Some(winner) = matched.first() else {
        return Err(unresolved(intents));
    };
    let total: usize = matched.iter().map(|k| k.len).sum();
    let share = |k: &Keyword| k.len as f64 / total.max(1) as f64;
    let confidence = share(winner);
    let capability = |k: &Keyword| {
        intents
            .rules()
            .get(k.rule)
            .map_or("?", |r| r.capability.as_str())
    };
    let why = match matched.get(1) {
        Some(second) if second.len == winner.len => Some(format!(
            "`{}` (\"{}\") and `{}` (\"{}\") match keywords of the same length",
            capability(winner),
            winner.text(),
            capability(second),
            second.text()
        )),
        _ if confidence < threshold => Some(format!(
            "`{}` (\"{}\") leads with confidence {confidence:.2}, under the policy's intent_threshold {threshold:.2}",
            capability(winner),
            winner.text()
        )),
        _ => None,
    };
    if let Some(why) = why {
        let candidates = matched
            .iter()
            .map(|k| {
                serde_json::json!({
                    "capability": capability(k),
                    "keyword": k.text(),
                    "confidence": share(k),
                })
            })
            .collect::<Vec<_>>();
        return Err(ReachError::IntentAmbiguous {
            why,
            candidates: candidates.into(),
        });
    }
    let rule = intents
        .rules()
        .get(winner.rule)
        .ok_or(ReachError::Internal)?;
    Ok(Resolved {
        capability: &rule.capability,
        keyword: winner.text(),
        confidence,
    })
}

/// No rule matched: the refusal names every rule's capability and keywords.
fn unresolved(intents: &Intents) -> ReachError {
    let rules = intents.rules();
    let names = if rules.is_empty() {
        "no capability (the policy has no `intents` rules)".to_owned()
    } else {
        rules
            .iter()
            .map(|r| format!("`{}`", r.capability))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let candidates = rules
        .iter()
        .map(|r| serde_json::json!({ "capability": r.capability, "keywords": r.keywords }))
        .collect::<Vec<_>>();
    ReachError::IntentUnresolved {
        names,
        candidates: candidates.into(),
    }
}

/// The text a buffered body offers for its intent: a JSON body's string values (its keys and
/// structure say nothing of the task), any other body's UTF-8 text; at most [`MAX_TEXT`].
pub(in crate::outbound) fn body_text(body: &Bytes) -> Cow<'_, str> {
    let trimmed = body.trim_ascii_start();
    if trimmed.starts_with(b"{") || trimmed.starts_with(b"[") {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
            let mut out = String::new();
            strings(&value, &mut out);
            return Cow::Owned(out);
        }
    }
    let head = body.get(..MAX_TEXT).unwrap_or(body);
    String::from_utf8_lossy(head)
}

/// Appends the string values of `value`, separated by newlines, until [`MAX_TEXT`] is reached.
fn strings(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    if out.len() >= MAX_TEXT {
        return;
    }
    match value {
        Value::String(s) => {
            let room = MAX_TEXT - out.len();
            // Cut on a character boundary.
            let end = (0..=room.min(s.len()))
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            out.push_str(&s[..end]);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IntentRule;

    fn intents(rules: &[(&str, &[&str])]) -> Intents {
        let rules = rules
            .iter()
            .map(|(capability, keywords)| IntentRule {
                capability: Name::parse(capability).unwrap_or_else(|e| panic!("{e}")),
                keywords: keywords.iter().map(|k| (*k).to_owned()).collect(),
            })
            .collect();
        Intents::compile(rules).unwrap_or_else(|e| panic!("{e}"))
    }

    fn fleet() -> Intents {
        intents(&[
            ("data-fetch", &["fetch", "crawl", "download"]),
            ("review", &["review", "pull request"]),
            ("summarize", &["summary", "tl dr"]),
        ])
    }

    fn pick(intents: &Intents, threshold: f64, text: &str) -> Result<(String, String), String> {
        resolve(intents, threshold, text)
            .map(|r| (r.capability.to_string(), r.keyword.to_owned()))
            .map_err(|e| e.code().to_owned())
    }

    fn ok(capability: &str, keyword: &str) -> Result<(String, String), String> {
        Ok((capability.to_owned(), keyword.to_owned()))
    }

    #[test]
    fn folds_case_including_unicode() {
        let fleet = fleet();
        assert_eq!(
            pick(&fleet, 0.6, "Please CRAWL this site"),
            ok("data-fetch", "crawl")
        );
        let german = intents(&[("translate", &["Übersetzen"])]);
        assert_eq!(
            pick(&german, 0.6, "bitte ÜBERSETZEN"),
            ok("translate", "übersetzen")
        );
    }

    #[test]
    fn matches_whole_words_only() {
        let fleet = fleet();
        assert_eq!(
            pick(&fleet, 0.6, "prefetching"),
            Err("intent_unresolved".into())
        );
        assert_eq!(pick(&fleet, 0.6, "re-crawl it"), ok("data-fetch", "crawl"));
        assert_eq!(
            pick(&fleet, 0.6, "look at this Pull\n  Request, please"),
            ok("review", "pull request")
        );
        assert_eq!(
            pick(&fleet, 0.6, "pull the request"),
            Err("intent_unresolved".into())
        );
    }

    #[test]
    fn the_longest_keyword_wins_with_its_share_as_confidence() {
        let fleet = fleet();
        // "pull request" (12) against "fetch" (5): 12 / 17.
        let r = resolve(&fleet, 0.6, "fetch the pull request").map_err(|e| e.to_string());
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.capability.as_str(), "review");
        assert!(
            (r.confidence - 12.0 / 17.0).abs() < 1e-9,
            "{}",
            r.confidence
        );
        // One rule alone is sure, however many of its keywords match.
        let r = resolve(&fleet, 1.0, "crawl and download").map_err(|e| e.to_string());
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((r.keyword, r.confidence), ("download", 1.0));
        assert_eq!(
            r.header(),
            "data-fetch; by=intent; keyword=\"download\"; confidence=1.00"
        );
    }

    #[test]
    fn a_tie_or_a_low_confidence_is_ambiguous_and_names_the_candidates() {
        let fleet = fleet();
        // "review" (6) against "crawl" (5): 6 / 11 = 0.55, under 0.6.
        let err = resolve(&fleet, 0.6, "crawl then review").err();
        let Some(ReachError::IntentAmbiguous { candidates, why }) = err else {
            panic!("not ambiguous: {err:?}");
        };
        assert!(why.contains("0.55"), "{why}");
        assert_eq!(candidates[0]["capability"], "review");
        assert_eq!(candidates[1]["keyword"], "crawl");
        // The same text resolves under a lower threshold.
        assert_eq!(
            pick(&fleet, 0.5, "crawl then review"),
            ok("review", "review")
        );
        // "fetch" and "tl dr" are both five characters: a tie at any threshold.
        assert_eq!(
            pick(&fleet, 0.0, "fetch it, tl;dr"),
            Err("intent_ambiguous".into())
        );
    }

    #[test]
    fn no_match_names_every_rule() {
        let err = resolve(&fleet(), 0.6, "hello there").err();
        let Some(ReachError::IntentUnresolved { candidates, names }) = err else {
            panic!("not unresolved: {err:?}");
        };
        assert_eq!(names, "`data-fetch`, `review`, `summarize`");
        assert_eq!(candidates[1]["keywords"][1], "pull request");
        let none = Intents::default();
        assert_eq!(pick(&none, 0.6, "crawl"), Err("intent_unresolved".into()));
    }

    #[test]
    fn a_json_body_offers_its_string_values_and_other_bodies_their_text() {
        let json = Bytes::from(r#"{"task": "Crawl it", "n": 3, "crawl_depth": 2, "more": ["x"]}"#);
        let text = body_text(&json);
        assert!(
            text.contains("Crawl it\n") && text.contains("x\n"),
            "{text}"
        );
        assert!(
            !text.contains("crawl_depth"),
            "keys are not the task: {text}"
        );
        let text = Bytes::from("please download");
        assert_eq!(body_text(&text), "please download");
        let long = Bytes::from(vec![b'a'; MAX_TEXT + 10]);
        assert_eq!(body_text(&long).len(), MAX_TEXT);
        let broken = Bytes::from("{ not json, just crawl");
        assert_eq!(body_text(&broken), "{ not json, just crawl");
    }

    #[test]
    fn a_keyword_outside_ascii_is_escaped_in_the_header() {
        let german = intents(&[("translate", &["übersetzen"])]);
        let r = resolve(&german, 0.6, "übersetzen").map_err(|e| e.to_string());
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            r.header(),
            "translate; by=intent; keyword=\"%C3%BCbersetzen\"; confidence=1.00"
        );
    }
}
