//! The two files' range tables (`bootstrap::RULES`, `policy::RULES`) against whole documents:
//! the full examples pass, every rule refuses bad values at the place they are written and
//! accepts its bounds, and no numeric key lacks a row. Beside `bounds`, not in it: these need
//! the tables, and the tables need `bounds`.

use std::path::Path;
use std::time::Duration;

use super::yaml::{self, Mapping, Value};

use super::bounds::{rule_for, Row, Rule, MS};
use super::duration::{format_duration, parse_duration};
use super::{bootstrap, parse_bootstrap, parse_policy, policy, ConfigError};

type Parse = fn(&Path, &str) -> Result<(), ConfigError>;

fn parse_b(path: &Path, text: &str) -> Result<(), ConfigError> {
    parse_bootstrap(path, text).map(|_| ())
}

fn parse_p(path: &Path, text: &str) -> Result<(), ConfigError> {
    parse_policy(path, text).map(|_| ())
}

fn example(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap_or_default();
    yaml::from_str(&text).unwrap_or(Value::Null)
}

/// The example bootstrap with every optional numeric key present.
fn full_bootstrap() -> Value {
    let mut doc = example("agent-reach.yaml");
    if let Some(cap) = doc["agent"]["capabilities"].get_mut(0) {
        cap["expected_duration"] = "5s".into();
        cap["paths"] = vec![Value::from("/review")].into();
        cap["probe"]["expect_json"] =
            yaml::from_str("{ pointer: /ok, value: true }").unwrap_or_default();
        let quality =
            "{ interval: 1h, threshold: 0.8, tasks: [{ path: /review, baseline: b.json }] }";
        cap["quality"] = yaml::from_str(quality).unwrap_or_default();
    }
    doc
}

/// The example policy with one external target holding every optional key.
fn full_policy() -> Value {
    let mut doc = example("policy.yaml");
    let target = "{ name: inventory, capability: inventory, endpoints: [127.0.0.1:1], timeout: 2s, max_concurrency: 32, rate_limit: { per_second: 50, burst: 100 }, budget_group: acme-openai }";
    doc["targets"] = Value::Sequence(vec![yaml::from_str(target).unwrap_or_default()]);
    doc
}

/// Sets the value at a table pattern (`[]`: the first item, `*`: the first key) and
/// returns the concrete path serde_yaml names in its errors.
fn set(doc: &mut Value, pattern: &str, value: Value) -> String {
    let mut node = doc;
    let mut named = Vec::new();
    for segment in pattern.split('.') {
        let (key, item) = match segment.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (segment, false),
        };
        if !node.is_mapping() {
            *node = Value::Mapping(Mapping::new());
        }
        let key = if key == "*" {
            node.as_mapping()
                .and_then(|m| m.keys().next())
                .and_then(Value::as_str)
                .unwrap_or("x")
                .to_owned()
        } else {
            key.to_owned()
        };
        node = &mut node[key.as_str()];
        if item {
            if !matches!(node.as_sequence(), Some(s) if !s.is_empty()) {
                *node = Value::Sequence(vec![Value::Null]);
            }
            node = &mut node[0];
            named.push(format!("{key}[0]"));
        } else {
            named.push(key);
        }
    }
    *node = value;
    named.join(".")
}

fn secs_f(d: Duration) -> Value {
    Value::from(format_duration(d))
}

/// Values `rule` must refuse.
fn bad_values(rule: Rule) -> Vec<Value> {
    let mut bad = vec![Value::from(f64::NAN), Value::from(f64::INFINITY)];
    match rule {
        Rule::Whole(min, max) => {
            bad.push(Value::from(max as f64 + 1.0));
            bad.push(Value::from(min as f64 + 0.5));
            bad.push(Value::from(min as i64 - 1));
        }
        Rule::Real(min, max) => {
            bad.extend([Value::from(f64::NEG_INFINITY), Value::from(min - 0.5)]);
            bad.push(Value::from(max + 0.5));
        }
        Rule::Above(min, max) => {
            bad.extend([Value::from(min), Value::from(max * 2.0)]);
        }
        Rule::Span(min, max) => {
            bad.clear();
            if let Some(below) = min.checked_sub(MS) {
                bad.push(secs_f(below));
            }
            bad.push(secs_f(max + Duration::from_secs(1)));
        }
        Rule::Loopback => bad = vec!["0.0.0.0:4140".into(), "10.1.2.3:4140".into()],
        Rule::PathPrefix => bad = vec!["review".into(), "".into()],
        Rule::Any => bad.clear(),
    }
    bad
}

/// Values `rule` must accept (its bounds are inclusive unless it says otherwise).
fn good_values(rule: Rule) -> Vec<Value> {
    match rule {
        Rule::Whole(min, max) => vec![Value::from(min), Value::from(max)],
        Rule::Real(min, max) => vec![Value::from(min), Value::from(max)],
        Rule::Above(_, max) => vec![Value::from(max)],
        Rule::Span(min, max) => vec![secs_f(min), secs_f(max)],
        Rule::Loopback => vec!["127.0.0.1:4140".into(), "[::1]:4140".into()],
        Rule::PathPrefix => vec!["/review".into()],
        Rule::Any => vec![Value::Null],
    }
}

fn files() -> [(&'static str, &'static [Row], Value, Parse); 2] {
    [
        ("bootstrap", bootstrap::RULES, full_bootstrap(), parse_b),
        ("policy", policy::RULES, full_policy(), parse_p),
    ]
}

#[test]
fn the_full_examples_are_valid() {
    for (file, _, doc, parse) in files() {
        let text = yaml::to_string(&doc).unwrap_or_default();
        let parsed = parse(Path::new(file), &text);
        assert!(parsed.is_ok(), "{file}: {parsed:?}\n{text}");
    }
}

#[test]
fn every_rule_refuses_bad_values_where_they_are_written() {
    let mut checked = 0;
    for (file, rules, base, parse) in files() {
        for (pattern, rule) in rules {
            for bad in bad_values(*rule) {
                let mut doc = base.clone();
                let key = set(&mut doc, pattern, bad.clone());
                let text = yaml::to_string(&doc).unwrap_or_default();
                let err = match parse(Path::new(file), &text) {
                    Ok(()) => panic!("{file}: `{key}: {bad:?}` was accepted\n{text}"),
                    Err(err) => err,
                };
                let ConfigError::Invalid {
                    line,
                    column,
                    message,
                    ..
                } = &err
                else {
                    panic!("{err}");
                };
                assert!(message.starts_with(&format!("{key}: ")), "{key}: {err}");
                // The position is the bad value's own.
                let written = yaml::to_string(&bad).unwrap_or_default();
                let at = text
                    .lines()
                    .nth(line - 1)
                    .and_then(|l| l.get(column - 1..))
                    .unwrap_or_default();
                assert!(
                    at.starts_with(written.trim()),
                    "{key}: {err} points at `{at}`, not `{}`",
                    written.trim()
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 200, "{checked}");
}

#[test]
fn every_rule_accepts_its_bounds() {
    for (file, rules, base, parse) in files() {
        for (pattern, rule) in rules {
            for good in good_values(*rule) {
                let mut doc = base.clone();
                let key = set(&mut doc, pattern, good.clone());
                let text = yaml::to_string(&doc).unwrap_or_default();
                let parsed = parse(Path::new(file), &text);
                assert!(parsed.is_ok(), "{file}: `{key}: {good:?}`: {parsed:?}");
            }
        }
    }
}

/// Every number in a file (and every duration) has a row: a key added without one fails here.
#[test]
fn numeric_keys_all_have_a_rule() {
    fn walk(node: &Value, path: &str, rules: &[Row], missing: &mut Vec<String>) {
        let child = |k: &str| {
            if path.is_empty() {
                k.to_owned()
            } else {
                format!("{path}.{k}")
            }
        };
        match node {
            Value::Mapping(map) => {
                for (k, v) in map {
                    walk(v, &child(k.as_str().unwrap_or("?")), rules, missing);
                }
            }
            Value::Sequence(items) => {
                for v in items {
                    walk(v, &format!("{path}[]"), rules, missing);
                }
            }
            Value::Number(_) if rule_for(rules, path).is_none() => {
                missing.push(path.to_owned());
            }
            Value::String(s) if parse_duration(s).is_ok() && rule_for(rules, path).is_none() => {
                missing.push(path.to_owned());
            }
            _ => {}
        }
    }
    // Through the typed values, so keys the examples leave out (defaults) are seen too.
    let bootstrap = yaml::to_string(&full_bootstrap())
        .ok()
        .and_then(|t| parse_bootstrap(Path::new("b"), &t).ok())
        .and_then(|b| yaml::to_value(b).ok());
    let policy = yaml::to_string(&full_policy())
        .ok()
        .and_then(|t| parse_policy(Path::new("p"), &t).ok())
        .and_then(|p| yaml::to_value(p).ok());
    let mut missing = Vec::new();
    walk(
        &bootstrap.unwrap_or_default(),
        "",
        bootstrap::RULES,
        &mut missing,
    );
    let mut from_policy = Vec::new();
    walk(
        &policy.unwrap_or_default(),
        "",
        policy::RULES,
        &mut from_policy,
    );
    missing.extend(from_policy);
    assert!(missing.is_empty(), "keys without a rule: {missing:?}");
}

fn parse_chains(text: &str) -> Result<crate::config::Policy, ConfigError> {
    crate::config::parse_policy(Path::new("policy.yaml"), text)
}

/// `chains` and the per-capability keys of `docs/chains.md`.
#[test]
fn the_chain_keys_parse_and_default() {
    let policy = parse_chains(
        "chains: { max_hops: 4 }\ncapabilities:\n  review: { reentrant: true, first_event_timeout: 500ms, hedge: { after: p95 } }\n  plan: { hedge: { after: 200ms, max: 1 } }\n",
    )
    .unwrap_or_default();
    assert_eq!(policy.chains.max_hops, 4);
    let review = &policy.capabilities["review"];
    assert!(review.reentrant);
    assert_eq!(
        review.first_event_timeout.map(|d| d.get()),
        Some(std::time::Duration::from_millis(500))
    );
    assert_eq!(
        review.hedge.as_ref().map(|h| h.after),
        Some(crate::config::HedgeAfter::P95)
    );
    let plan = &policy.capabilities["plan"];
    assert_eq!(plan.hedge.as_ref().map(|h| h.max), Some(1));
    assert_eq!(crate::config::Policy::default().chains.max_hops, 8);
}

/// A bad chain key names its line (what `agent-reach check` prints).
#[test]
fn bad_chain_keys_name_their_line() {
    for (text, line) in [
        ("chains:\n  max_hops: 0\n", 2),
        ("capabilities:\n  review:\n    hedge: { after: soon }\n", 3),
        ("capabilities:\n  review:\n    hedge: { after: 0s }\n", 3),
        (
            "capabilities:\n  review:\n    hedge: { after: p95, max: 2 }\n",
            3,
        ),
        ("capabilities:\n  review:\n    first_event_timeout: 2h\n", 3),
    ] {
        match parse_chains(text) {
            Err(ConfigError::Invalid { line: at, .. }) => assert_eq!(at, line, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}
