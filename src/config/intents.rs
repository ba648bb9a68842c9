//! Policy `intents`: keyword rules that pick the capability of a call that names none
//! (`any.reach`, or a `reach-intent` header). Checked and compiled once, when the policy loads,
//! so a call only case-folds its own text and looks the keywords up (`outbound::resolve::intent`).

use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::scalar::Name;

/// The authority label that asks for intent routing (`any.reach`): never a capability's name.
pub(crate) const ANY: &str = "any";

/// One rule as written: `{capability: data-fetch, keywords: [fetch, crawl, download]}`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IntentRule {
    pub capability: Name,
    pub keywords: Vec<String>,
}

/// One case-folded keyword and the rule that owns it.
#[derive(Clone, Debug)]
pub(crate) struct Keyword {
    /// The folded words with a space on each side (` pull request `), so a plain substring
    /// search over folded text (also padded) matches on word boundaries only.
    padded: String,
    /// Characters of the folded keyword, without the padding: what "longest" compares.
    pub(crate) len: usize,
    /// Index of the owning rule in [`Intents::rules`].
    pub(crate) rule: usize,
}

impl Keyword {
    /// The folded keyword (`pull request`).
    pub(crate) fn text(&self) -> &str {
        self.padded.trim_matches(' ')
    }

    /// Whether `folded` (the output of [`fold_padded`]) contains this keyword as whole words.
    pub(crate) fn occurs_in(&self, folded: &str) -> bool {
        folded.contains(&self.padded)
    }
}

/// Policy `intents`: the rules as written, and their keywords compiled, longest first.
#[derive(Clone, Debug, Default)]
pub struct Intents {
    rules: Vec<IntentRule>,
    keywords: Vec<Keyword>,
}

impl Intents {
    /// Checks the rules and compiles them: every keyword folded, all of them longest first.
    pub fn compile(rules: Vec<IntentRule>) -> Result<Self, String> {
        let mut keywords: Vec<Keyword> = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let capability = &rule.capability;
            if capability.as_str() == ANY {
                return Err(format!(
                    "rule {i}: `{ANY}` is reserved (`{ANY}.reach` asks for intent routing) and cannot be a rule's capability"
                ));
            }
            if rules[..i].iter().any(|r| r.capability == *capability) {
                return Err(format!(
                    "rule {i}: capability `{capability}` has a rule already: give it one rule with all its keywords"
                ));
            }
            if rule.keywords.is_empty() {
                return Err(format!(
                    "rule {i}: capability `{capability}` lists no keywords"
                ));
            }
            for written in &rule.keywords {
                let padded = fold_keyword(written)
                    .map_err(|why| format!("rule {i} (`{capability}`): {why}"))?;
                if let Some(other) = keywords.iter().find(|k| k.padded == padded) {
                    if other.rule == i {
                        continue; // the same word twice in one rule: harmless
                    }
                    let owner = rules.get(other.rule).map_or("?", |r| r.capability.as_str());
                    return Err(format!(
                        "rule {i} (`{capability}`): keyword `{}` is also a keyword of `{owner}`: a keyword must name one capability",
                        other.text()
                    ));
                }
                let len = padded.chars().count() - 2;
                keywords.push(Keyword {
                    padded,
                    len,
                    rule: i,
                });
            }
        }
        // Longest first, so the first keyword of a rule found in a text is its longest match.
        keywords.sort_by(|a, b| b.len.cmp(&a.len).then_with(|| a.padded.cmp(&b.padded)));
        Ok(Self { rules, keywords })
    }

    pub(crate) fn rules(&self) -> &[IntentRule] {
        &self.rules
    }

    /// Every keyword, longest first.
    pub(crate) fn keywords(&self) -> &[Keyword] {
        &self.keywords
    }
}

/// Compared (and so reloaded) by the rules as written; the compiled table follows from them.
impl PartialEq for Intents {
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules
    }
}

impl Serialize for Intents {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.rules.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Intents {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked inside the list's visitor: an error raised there carries the policy's key path
        // and a line (serde_yaml's, of the list), so `check` and a reload point at the rules.
        struct Rules;
        impl<'de> Visitor<'de> for Rules {
            type Value = Intents;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of `{capability, keywords}` rules")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Intents, A::Error> {
                let mut rules = Vec::new();
                while let Some(rule) = seq.next_element::<IntentRule>()? {
                    rules.push(rule);
                }
                Intents::compile(rules).map_err(de::Error::custom)
            }
        }
        d.deserialize_seq(Rules)
    }
}

/// A keyword as compiled: its words folded, padded with a space each side. A keyword is words of
/// letters and digits separated by spaces, `-` or `_`; anything else would be dropped by folding
/// (`c++` would match every `c`), so it is refused instead.
fn fold_keyword(written: &str) -> Result<String, String> {
    if let Some(c) = written
        .chars()
        .find(|c| !(c.is_alphanumeric() || c.is_whitespace() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "keyword `{written}` holds `{c}`: a keyword is words of letters and digits, separated by spaces, `-` or `_`"
        ));
    }
    let padded = fold_padded(written);
    if padded.len() <= 2 {
        return Err("a keyword is empty".to_owned());
    }
    Ok(padded)
}

/// `text` case-folded (Unicode lowercase) into its words (runs of letters and digits) joined by
/// single spaces, with a space each side: `"Please CRAWL\nthis-site!"` → `" please crawl this site "`.
pub(crate) fn fold_padded(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push(' ');
    for c in text.chars() {
        if c.is_alphanumeric() {
            out.extend(c.to_lowercase());
        } else if !out.ends_with(' ') {
            out.push(' ');
        }
    }
    if !out.ends_with(' ') {
        out.push(' ');
    }
    out
}

/// Policy `intent_threshold`: the least confidence an intent resolves with (`docs/intents.md`).
#[derive(Clone, Copy, Debug, Serialize, PartialEq, PartialOrd)]
#[serde(transparent)]
pub struct IntentThreshold(pub f64);

impl Default for IntentThreshold {
    fn default() -> Self {
        Self(0.6)
    }
}

impl<'de> Deserialize<'de> for IntentThreshold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // The range is checked by the policy's table (`intent_threshold`), where it is written.
        f64::deserialize(d).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(capability: &str, keywords: &[&str]) -> IntentRule {
        IntentRule {
            capability: Name::parse(capability).unwrap_or_else(|e| panic!("{e}")),
            keywords: keywords.iter().map(|k| (*k).to_owned()).collect(),
        }
    }

    #[test]
    fn folds_words_case_and_separators() {
        assert_eq!(
            fold_padded("Please CRAWL\nthis-site!"),
            " please crawl this site "
        );
        assert_eq!(fold_padded("ÜBER  Straße"), " über straße ");
        assert_eq!(fold_padded(""), " ");
    }

    #[test]
    fn compiles_longest_first() {
        let intents = Intents::compile(vec![
            rule("data-fetch", &["fetch", "Download"]),
            rule("review", &["Pull  Request"]),
        ]);
        let intents = intents.unwrap_or_else(|e| panic!("{e}"));
        let texts: Vec<&str> = intents.keywords().iter().map(Keyword::text).collect();
        assert_eq!(texts, ["pull request", "download", "fetch"]);
    }

    #[test]
    fn a_policy_file_reports_a_bad_rule_where_it_is_written() {
        let parse = |text: &str| {
            super::super::parse_policy(std::path::Path::new("p.yaml"), text)
                .map_err(|e| e.to_string())
        };
        let text = "intent_threshold: 0.7\nintents:\n  - { capability: fetch, keywords: [crawl] }\n  - { capability: review, keywords: [Crawl] }\n";
        let err = parse(text).err().unwrap_or_default();
        // serde_yaml places an error raised by a whole list at its first item.
        assert!(
            err.starts_with("p.yaml:3:3: intents: rule 1 (`review`)"),
            "{err}"
        );
        assert!(
            err.contains("`crawl` is also a keyword of `fetch`"),
            "{err}"
        );
        let err = parse("intent_threshold: 1.5\n").err().unwrap_or_default();
        assert!(err.contains("intent_threshold"), "{err}");
        let policy = parse("intents: [{ capability: fetch, keywords: [crawl] }]\n");
        let policy = policy.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.intent_threshold, IntentThreshold(0.6));
        assert_eq!(policy.intents.keywords().len(), 1);
    }

    #[test]
    fn refuses_bad_rules_with_a_clear_reason() {
        let err = |rules| Intents::compile(rules).err().unwrap_or_default();
        assert!(err(vec![rule("a", &[" "])]).contains("empty"));
        assert!(err(vec![rule("a", &[])]).contains("no keywords"));
        assert!(err(vec![rule("a", &["c++"])]).contains("`+`"));
        assert!(err(vec![rule("any", &["x"])]).contains("reserved"));
        assert!(err(vec![rule("a", &["x"]), rule("a", &["y"])]).contains("has a rule already"));
        let shared = err(vec![rule("a", &["Fetch"]), rule("b", &["fetch"])]);
        assert!(
            shared.contains("`fetch` is also a keyword of `a`"),
            "{shared}"
        );
    }
}
