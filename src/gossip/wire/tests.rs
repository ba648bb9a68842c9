use super::future::{self, NextLive};
use super::*;

fn node() -> NodeId {
    NodeId {
        addr: "10.1.2.3:4190"
            .parse()
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        epoch: 1_764_489_600_123,
    }
}

fn live() -> Live {
    Live {
        profile_seq: 1,
        state: AgentState::Healthy,
        state_age_s: 120,
        cap: 1000,
        availability: 990,
        saturation: 250,
        latency_ms: Some(40),
        p50_ms: Some(38),
        p95_ms: Some(90),
        busy: false,
        cooling_down: false,
        in_flight: 3,
        queued: 0,
        saturation_predicted: 600,
        quality_milli: Some(250),
        degraded: true,
        budget: vec![
            LiveBudget {
                group: None,
                headroom_milli: Some(300),
                reset_ms: 41_000,
                age_ms: 150,
                credential: None,
            },
            LiveBudget {
                group: Some("acme-openai".into()),
                headroom_milli: None,
                reset_ms: 0,
                age_ms: 0,
                credential: Some(0x0123_4567_89ab_cdef),
            },
        ],
    }
}

fn live_item() -> Item {
    Item {
        name: "coder-2".into(),
        node: node(),
        seq: 1234,
        body: Body::Live(live()),
    }
}

fn profile_item() -> Item {
    Item {
        name: "coder-2".into(),
        node: node(),
        seq: 1233,
        body: Body::Profile(Profile {
            inbound: "10.1.2.3:4143".into(),
            zone: "a".into(),
            region: "r".into(),
            max_concurrency: 4,
            capabilities: vec![Capability {
                name: "code".into(),
                tags: [("python".to_owned(), 900)].into_iter().collect(),
                timeout_ms: 30_000,
                mode: Mode::Async,
                cost_milli: 1500,
                idempotent: true,
                output_schema: Some([0xab; 32]),
                skill: Some(Skill {
                    streaming: true,
                    input_modes: vec!["text/plain".into()],
                    output_modes: vec!["text/plain".into(), "application/json".into()],
                }),
                tools: vec![Tool {
                    name: "search".into(),
                    title: "Search the web".into(),
                    schema: [0x5c; 8],
                    hints: 1,
                }],
            }],
            version: "0.1.0".into(),
            identity: "spiffe://prod.example/ns/a/sa/coder".into(),
        }),
    }
}

fn pins_item() -> Item {
    Item {
        name: "coder-2".into(),
        node: node(),
        seq: 1235,
        body: Body::Pins(Pins {
            pins: vec![
                Pin {
                    capability: "mcp".into(),
                    tool: "fetch".into(),
                    digest: [0x01; 8],
                },
                Pin {
                    capability: "mcp".into(),
                    tool: "search".into(),
                    digest: [0x5c; 8],
                },
            ],
        }),
    }
}

fn known(read: Result<Decoded, WireError>) -> Option<Item> {
    match read {
        Ok(Decoded::Known(item)) => Some(item),
        _ => None,
    }
}

#[test]
fn a_live_item_is_small() {
    let item = live_item();
    let bytes = encode_item(&item).unwrap_or_default();
    // Two model budgets, one of them a group's with its credential: 27 bytes more than none.
    assert!(bytes.len() < 112, "{} bytes", bytes.len());
    assert_eq!(known(decode_item(&bytes)), Some(item.clone()));
    let mut plain = item;
    if let Body::Live(l) = &mut plain.body {
        l.budget.clear();
    }
    let bytes = encode_item(&plain).unwrap_or_default();
    assert!(bytes.len() < 64, "{} bytes", bytes.len());
}

#[test]
fn an_item_starts_with_its_kind_version_and_length() {
    let bytes = encode_item(&live_item()).unwrap_or_default();
    assert_eq!(bytes[0], ItemKind::Live.code());
    assert_eq!(bytes[1], ItemKind::Live.version());
    assert_eq!(usize::from(bytes[2]), bytes.len() - 3, "a one-byte varint");
}

#[test]
fn garbage_does_not_decode() {
    assert!(decode_item(&[0xff; 40]).is_err());
    assert!(decode_item(&[]).is_err());
    assert!(decode_want(&[]).is_err());
    let mut two = encode_item(&live_item()).unwrap_or_default();
    two.extend_from_slice(&two.clone());
    assert!(decode_item(&two).is_err(), "one broadcast is one item");
}

#[test]
fn fractions_are_clamped_both_ways() {
    assert_eq!(milli(f64::NAN), 0);
    assert_eq!(milli(2.0), 1000);
    assert_eq!(unmilli(u16::MAX), 1.0);
}

#[test]
fn every_code_is_distinct_and_reads_back() {
    for state in AgentState::ALL {
        assert_eq!(AgentState::from_code(state.code()).ok(), Some(state));
    }
    let codes: std::collections::HashSet<u8> = AgentState::ALL.iter().map(|s| s.code()).collect();
    assert_eq!(codes.len(), AgentState::ALL.len());
    for mode in [Mode::Sync, Mode::Async] {
        assert_eq!(Mode::from_code(mode.code()).ok(), Some(mode));
    }
    assert!(AgentState::from_code(6).is_err());
}

/// The old and the new encoding of `Live` on each other's decoder: this sidecar and
/// the next (`NextLive`, one version newer, one field appended).
#[test]
fn an_old_reader_skips_a_newer_field_and_a_new_reader_defaults_a_missing_one() {
    let head = live_item();
    let next = NextLive {
        live: live(),
        queue_limit: 16,
    };
    let new_bytes = next.encode(&head).unwrap_or_default();
    assert_eq!(
        new_bytes[1],
        ItemKind::Live.version() + 1,
        "written one version newer"
    );
    // Old reads new: every field it knows, the appended one ignored.
    assert_eq!(known(decode_item(&new_bytes)), Some(head.clone()));
    // New reads old: the missing field takes its default.
    let old_bytes = encode_item(&head).unwrap_or_default();
    let read = NextLive::decode(&old_bytes).ok();
    assert_eq!(
        read,
        Some((
            head.clone(),
            NextLive {
                live: live(),
                queue_limit: 0
            }
        ))
    );
    // New reads new.
    assert_eq!(
        NextLive::decode(&new_bytes)
            .ok()
            .map(|(_, n)| n.queue_limit),
        Some(16)
    );
}

/// A live view as version 1 (no `saturation_predicted`), 2 (no `quality_milli`, `degraded`) or
/// 3 (no `budget`) wrote it.
fn old_live(item: &Item, version: u8) -> Vec<u8> {
    let Body::Live(l) = &item.body else {
        return Vec::new();
    };
    let mut w = Writer::default();
    let written = write_frame(&mut w, ItemKind::Live.code(), version, item, |w| {
        w.put(&l.profile_seq)?;
        w.put(&l.state.code())?;
        w.put(&l.state_age_s)?;
        w.put(&l.cap)?;
        w.put(&l.availability)?;
        w.put(&l.saturation)?;
        w.put(&l.latency_ms)?;
        w.put(&l.p50_ms)?;
        w.put(&l.p95_ms)?;
        w.put(&l.busy)?;
        w.put(&l.cooling_down)?;
        w.put(&l.in_flight)?;
        w.put(&l.queued)?;
        if version >= 2 {
            w.put(&l.saturation_predicted)?;
        }
        if version >= 3 {
            w.put(&l.quality_milli)?;
            w.put(&l.degraded)?;
        }
        Ok(())
    });
    assert!(written.is_ok());
    w.into_bytes()
}

#[test]
fn a_version_1_live_view_reads_with_no_prediction() {
    let item = live_item();
    let read = known(decode_item(&old_live(&item, 1)));
    let expected = Item {
        body: Body::Live(Live {
            // The default: what it sees now is all an older sidecar predicts.
            saturation_predicted: live().saturation,
            quality_milli: None,
            degraded: false,
            budget: Vec::new(),
            ..live()
        }),
        ..item
    };
    assert_eq!(read, Some(expected));
}

#[test]
fn a_version_2_live_view_reads_with_no_quality_mark() {
    let item = live_item();
    let read = known(decode_item(&old_live(&item, 2)));
    let expected = Item {
        body: Body::Live(Live {
            quality_milli: None,
            degraded: false,
            budget: Vec::new(),
            ..live()
        }),
        ..item
    };
    assert_eq!(read, Some(expected));
}

#[test]
fn a_version_3_live_view_reads_with_no_budget() {
    let item = live_item();
    let read = known(decode_item(&old_live(&item, 3)));
    let expected = Item {
        body: Body::Live(Live {
            budget: Vec::new(),
            ..live()
        }),
        ..item
    };
    assert_eq!(read, Some(expected));
}

/// A version 3 sidecar reads this one's live view: every field it knows, the budgets skipped.
#[test]
fn a_version_3_reader_skips_the_budget() {
    let bytes = encode_item(&live_item()).unwrap_or_default();
    let read = split_frame(&bytes).and_then(|(frame, _)| {
        let mut f = Fields::new(frame.version, 3, frame.record);
        let _head: (String, NodeId, u64) = (f.take()?, f.take()?, f.take()?);
        let (seq, state, age): (u64, u8, u32) = (f.take()?, f.take()?, f.take()?);
        let _figures: (u16, u16, u16) = (f.take()?, f.take()?, f.take()?);
        let _latency: [Option<u32>; 3] = [f.take()?, f.take()?, f.take()?];
        let _flags: (bool, bool, u32, u32, u16) =
            (f.take()?, f.take()?, f.take()?, f.take()?, f.take()?);
        let quality: Option<u16> = f.take()?;
        let degraded: bool = f.take()?;
        f.finish()?;
        Ok((seq, state, age, quality, degraded))
    });
    let l = live();
    assert_eq!(
        read.ok(),
        Some((
            l.profile_seq,
            l.state.code(),
            l.state_age_s,
            l.quality_milli,
            l.degraded
        ))
    );
}

#[test]
fn a_live_view_with_too_many_budgets_is_refused() {
    let mut item = live_item();
    if let Body::Live(l) = &mut item.body {
        l.budget = vec![LiveBudget::default(); MAX_LIVE_BUDGETS];
    }
    let bytes = encode_item(&item).unwrap_or_default();
    assert_eq!(known(decode_item(&bytes)), Some(item.clone()));
    if let Body::Live(l) = &mut item.body {
        l.budget = vec![LiveBudget::default(); MAX_LIVE_BUDGETS + 1];
    }
    // The writer sends no more than the bound, so a reader never refuses a sidecar's own view.
    let bytes = encode_item(&item).unwrap_or_default();
    let read = known(decode_item(&bytes));
    assert_eq!(
        read.and_then(|i| match i.body {
            Body::Live(l) => Some(l.budget.len()),
            Body::Profile(_) | Body::Pins(_) => None,
        }),
        Some(MAX_LIVE_BUDGETS)
    );
}

/// A capability as versions 1 and 2 wrote it (no `output_schema`), 3 (no `skill`) or 4 (no
/// `tools`).
fn write_old_capability(w: &mut Writer, c: &Capability, version: u8) -> Result<(), WireError> {
    w.put(&c.name)?;
    w.put(&c.tags)?;
    w.put(&c.timeout_ms)?;
    w.put(&c.mode.code())?;
    w.put(&c.cost_milli)?;
    w.put(&c.idempotent)?;
    if version >= 3 {
        w.put(&c.output_schema)?;
    }
    if version >= 4 {
        w.put(&c.skill)?;
    }
    Ok(())
}

/// A profile as an older sidecar writes it: version 1 (no `identity`) or 2 (no capability
/// `output_schema`).
fn old_profile(item: &Item, version: u8) -> Vec<u8> {
    let Body::Profile(p) = &item.body else {
        return Vec::new();
    };
    let mut w = Writer::default();
    let written = write_frame(&mut w, ItemKind::Profile.code(), version, item, |w| {
        w.put(&p.inbound)?;
        w.put(&p.zone)?;
        w.put(&p.region)?;
        w.put(&p.max_concurrency)?;
        w.put(&(p.capabilities.len() as u32))?;
        for c in &p.capabilities {
            w.record(|w| write_old_capability(w, c, version))?;
        }
        w.put(&p.version)?;
        if version >= 2 {
            w.put(&p.identity)?;
        }
        Ok(())
    });
    assert!(written.is_ok());
    w.into_bytes()
}

/// A profile from a sidecar before mutual TLS (version 1, no `identity`) reads with none, and
/// this one's carries it.
#[test]
fn a_version_1_profile_reads_with_no_identity() {
    let mut item = profile_item();
    let bytes = old_profile(&item, 1);
    if let Body::Profile(p) = &mut item.body {
        p.identity = String::new();
        p.capabilities.iter_mut().for_each(|c| {
            c.output_schema = None;
            c.skill = None;
            c.tools.clear();
        });
    }
    assert_eq!(known(decode_item(&bytes)), Some(item));
    let bytes = encode_item(&profile_item()).unwrap_or_default();
    assert_eq!(bytes[1], 5, "written as version 5");
    assert_eq!(known(decode_item(&bytes)), Some(profile_item()));
}

/// A profile from a sidecar before output validation (version 2) reads with no schema digest,
/// and this one's (version 3) carries it.
#[test]
fn a_version_2_profile_reads_with_no_output_schema() {
    let mut item = profile_item();
    let bytes = old_profile(&item, 2);
    if let Body::Profile(p) = &mut item.body {
        p.capabilities.iter_mut().for_each(|c| {
            c.output_schema = None;
            c.skill = None;
            c.tools.clear();
        });
    }
    assert_eq!(known(decode_item(&bytes)), Some(item));
    let read = known(decode_item(
        &encode_item(&profile_item()).unwrap_or_default(),
    ));
    let digest = match read.map(|i| i.body) {
        Some(Body::Profile(p)) => p.capabilities.first().and_then(|c| c.output_schema),
        _ => None,
    };
    assert_eq!(digest, Some([0xab; 32]));
}

/// A profile from a sidecar before A2A card import (version 3) reads with no skill facts.
#[test]
fn a_version_3_profile_reads_with_no_skill() {
    let mut item = profile_item();
    let bytes = old_profile(&item, 3);
    if let Body::Profile(p) = &mut item.body {
        p.capabilities.iter_mut().for_each(|c| {
            c.skill = None;
            c.tools.clear();
        });
    }
    assert_eq!(known(decode_item(&bytes)), Some(item));
}

/// A profile from a sidecar before MCP tool import (version 4) reads with no tools.
#[test]
fn a_version_4_profile_reads_with_no_tools() {
    let mut item = profile_item();
    let bytes = old_profile(&item, 4);
    if let Body::Profile(p) = &mut item.body {
        p.capabilities.iter_mut().for_each(|c| c.tools.clear());
    }
    assert_eq!(known(decode_item(&bytes)), Some(item));
}

/// A sidecar of version 4 reads this one's capability: every field it knows, the tools skipped
/// as a newer version's appended field.
#[test]
fn a_version_4_reader_skips_the_tools() {
    let Body::Profile(p) = profile_item().body else {
        return;
    };
    let Some(c) = p.capabilities.first() else {
        return;
    };
    let mut w = Writer::default();
    assert!(c.write(&mut w).is_ok());
    let bytes = w.into_bytes();
    let mut f = Fields::new(5, 4, &bytes);
    let name: Result<String, _> = f.take();
    assert_eq!(name.ok().as_deref(), Some("code"));
    // What a version-4 reader takes after the name, in its order; then `finish` skips the rest.
    assert!(f.take::<BTreeMap<String, u16>>().is_ok());
    assert!(f.take::<u64>().is_ok());
    assert!(f.take::<u8>().is_ok());
    assert!(f.take::<u32>().is_ok());
    assert!(f.take::<bool>().is_ok());
    assert!(f.since::<Option<[u8; 32]>>(3).is_ok());
    let skill = f.since::<Option<Skill>>(4).ok().flatten().flatten();
    assert_eq!(skill.map(|s| s.streaming), Some(true));
    assert!(f.finish().is_ok(), "the appended tools are skipped");
    // And a version-5 reader gets them back.
    let mut f = Fields::new(5, 5, &bytes);
    let read = Capability::read(&mut f).ok();
    assert_eq!(read.map(|c| c.tools), Some(c.tools.clone()));
}

#[test]
fn a_newer_profile_reads_with_its_appended_fields_skipped() {
    for item in [profile_item(), live_item()] {
        let bytes = future::encode_item(&item).unwrap_or_default();
        assert_eq!(known(decode_item(&bytes)), Some(item));
    }
}

#[test]
fn bytes_after_the_fields_of_a_version_this_sidecar_knows_are_refused() {
    // Version 1 with a field appended: an item no sender of version 1 writes.
    let mut w = Writer::default();
    let head = live_item();
    let written = write_frame(&mut w, ItemKind::Live.code(), 1, &head, |w| {
        live().write(w)?;
        w.put(&7u8)
    });
    assert!(written.is_ok());
    assert!(decode_item(&w.into_bytes()).is_err());
}

#[test]
fn an_item_of_an_unknown_kind_is_skipped_and_the_rest_is_read() {
    let (profile, live) = (profile_item(), live_item());
    let bytes = future::encode_items([&profile, &live]).unwrap_or_default();
    let read: Vec<Decoded> = decode_items(&bytes).filter_map(Result::ok).collect();
    assert_eq!(read.len(), 3);
    assert!(matches!(
        &read[0],
        Decoded::Unknown { kind: future::NEW_KIND, name, seq: 1233, .. } if name == "coder-2"
    ));
    assert_eq!(read[1], Decoded::Known(profile));
    assert_eq!(read[2], Decoded::Known(live));
}

#[test]
fn pins_round_trip_as_a_kind_of_their_own() {
    let item = pins_item();
    let bytes = encode_item(&item).unwrap_or_default();
    assert_eq!(
        (bytes[0], bytes[1]),
        (3, 1),
        "kind 3 (a byte never used before), version 1"
    );
    assert_eq!(known(decode_item(&bytes)), Some(item.clone()));
    // Each pin is 8 bytes of digest, its names and a record length.
    assert!(bytes.len() < 70, "{} bytes", bytes.len());
    let none = Item {
        body: Body::Pins(Pins::default()),
        ..item
    };
    let bytes = encode_item(&none).unwrap_or_default();
    assert_eq!(known(decode_item(&bytes)), Some(none));
}

/// A sidecar from before pins: it reads kinds 1 and 2 only, as this one reads a kind it does
/// not know (`Frame::read_knowing`).
fn read_as_before_pins(bytes: &[u8]) -> Vec<Result<Decoded, WireError>> {
    let mut read = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Ok((frame, after)) = split_frame(rest) else {
            read.push(Err(WireError::Invalid("broken frames")));
            break;
        };
        rest = after;
        read.push(
            frame.read_knowing(|code| ItemKind::from_code(code).filter(|k| *k != ItemKind::Pins)),
        );
    }
    read
}

#[test]
fn a_reader_from_before_pins_skips_them_and_reads_the_items_after_them() {
    let (pins, profile, live) = (pins_item(), profile_item(), live_item());
    let bytes = encode_items([&pins, &profile, &live]).unwrap_or_default();
    let read = read_as_before_pins(&bytes);
    assert_eq!(read.len(), 3);
    assert!(
        matches!(
            &read[0],
            Ok(Decoded::Unknown { kind: 3, version: 1, name, seq: 1235, .. }) if name == "coder-2"
        ),
        "{:?}",
        read[0]
    );
    assert_eq!(read[1].as_ref().ok(), Some(&Decoded::Known(profile)));
    assert_eq!(read[2].as_ref().ok(), Some(&Decoded::Known(live)));
    // And riding alone on a SWIM message, as a relayed item does: skipped whole.
    let one = encode_item(&pins).unwrap_or_default();
    let read = read_as_before_pins(&one);
    assert!(matches!(read[..], [Ok(Decoded::Unknown { kind: 3, .. })]));
}

#[test]
fn a_newer_pin_record_reads_with_its_appended_field_skipped() {
    let bytes = future::encode_item(&pins_item()).unwrap_or_default();
    assert_eq!(bytes[1], 2, "written one version newer");
    assert_eq!(known(decode_item(&bytes)), Some(pins_item()));
}

#[test]
fn an_item_that_does_not_decode_does_not_take_the_next_one_with_it() {
    // A live view with a state this sidecar does not know (a change the rule forbids).
    let mut w = Writer::default();
    let written = write_frame(&mut w, ItemKind::Live.code(), 1, &live_item(), |w| {
        w.put(&1u64)?;
        w.put(&9u8)
    });
    assert!(written.is_ok());
    let mut bytes = w.into_bytes();
    bytes.extend(encode_item(&live_item()).unwrap_or_default());
    let read: Vec<bool> = decode_items(&bytes).map(|r| r.is_ok()).collect();
    assert_eq!(read, vec![false, true]);
}

#[test]
fn a_want_reads_its_asker_and_ignores_what_a_newer_version_appended() {
    let mut bytes = encode_want(&node()).unwrap_or_default();
    bytes.extend_from_slice(b"more");
    assert_eq!(decode_want(&bytes).ok(), Some(node()));
}

mod properties {
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;

    use super::*;

    fn node() -> impl Strategy<Value = NodeId> {
        (any::<[u8; 4]>(), any::<u16>(), any::<u64>()).prop_map(|(ip, port, epoch)| NodeId {
            addr: SocketAddr::from((ip, port)),
            epoch,
        })
    }

    fn capability() -> impl Strategy<Value = Capability> {
        let mode = prop_oneof![Just(Mode::Sync), Just(Mode::Async)];
        (
            "[a-z-]{0,16}",
            btree_map("[a-z]{0,8}", any::<u16>(), 0..4),
            any::<u64>(),
            mode,
            any::<u32>(),
            any::<bool>(),
            proptest::option::of(any::<[u8; 32]>()),
        )
            .prop_map(
                |(name, tags, timeout_ms, mode, cost_milli, idempotent, output_schema)| {
                    Capability {
                        name,
                        tags,
                        timeout_ms,
                        mode,
                        cost_milli,
                        idempotent,
                        output_schema,
                        skill: None,
                        tools: Vec::new(),
                    }
                },
            )
    }

    fn profile() -> impl Strategy<Value = Profile> {
        (
            ".{0,24}",
            ".{0,8}",
            ".{0,8}",
            any::<u32>(),
            vec(capability(), 0..4),
            ".{0,8}",
            ".{0,40}",
        )
            .prop_map(
                |(inbound, zone, region, max_concurrency, capabilities, version, identity)| {
                    Profile {
                        inbound,
                        zone,
                        region,
                        max_concurrency,
                        capabilities,
                        version,
                        identity,
                    }
                },
            )
    }

    fn live() -> impl Strategy<Value = Live> {
        let figures = (any::<u64>(), any::<u32>(), any::<[u16; 3]>());
        let latencies = any::<[Option<u32>; 3]>();
        let rest = (
            any::<[bool; 3]>(),
            any::<[u32; 2]>(),
            any::<u16>(),
            any::<Option<u16>>(),
        );
        let state = prop::sample::select(AgentState::ALL.to_vec());
        (state, figures, latencies, rest).prop_map(
            |(state, (profile_seq, state_age_s, [cap, availability, saturation]), l, r)| Live {
                profile_seq,
                state,
                state_age_s,
                cap,
                availability,
                saturation,
                latency_ms: l[0],
                p50_ms: l[1],
                p95_ms: l[2],
                busy: r.0[0],
                cooling_down: r.0[1],
                in_flight: r.1[0],
                queued: r.1[1],
                saturation_predicted: r.2,
                quality_milli: r.3,
                degraded: r.0[2],
                budget: Vec::new(),
            },
        )
    }

    fn pins() -> impl Strategy<Value = Pins> {
        let pin =
            ("[a-z-]{0,16}", ".{0,16}", any::<[u8; 8]>()).prop_map(|(capability, tool, digest)| {
                Pin {
                    capability,
                    tool,
                    digest,
                }
            });
        vec(pin, 0..6).prop_map(|pins| Pins { pins })
    }

    fn item() -> impl Strategy<Value = Item> {
        let body = prop_oneof![
            profile().prop_map(Body::Profile),
            live().prop_map(Body::Live),
            pins().prop_map(Body::Pins)
        ];
        (".{0,24}", node(), any::<u64>(), body).prop_map(|(name, node, seq, body)| Item {
            name,
            node,
            seq,
            body,
        })
    }

    fn all_known(bytes: &[u8]) -> Option<Vec<Item>> {
        decode_items(bytes)
            .map(|r| match r {
                Ok(Decoded::Known(item)) => Some(item),
                _ => None,
            })
            .collect()
    }

    proptest! {
        #[test]
        fn an_item_round_trips(item in item()) {
            let bytes = encode_item(&item);
            prop_assert!(bytes.is_ok());
            let back = known(decode_item(&bytes.unwrap_or_default()));
            prop_assert_eq!(back, Some(item));
        }

        #[test]
        fn a_batch_of_items_round_trips(items in vec(item(), 0..4)) {
            let bytes = encode_items(&items).unwrap_or_default();
            prop_assert_eq!(all_known(&bytes), Some(items));
        }

        #[test]
        fn a_newer_version_of_any_item_reads_as_the_item(items in vec(item(), 1..4)) {
            let bytes = future::encode_items(&items).unwrap_or_default();
            let read: Vec<Decoded> = decode_items(&bytes).filter_map(Result::ok).collect();
            prop_assert_eq!(read.len(), items.len() + 1, "every item, and the unknown kind");
            let known: Vec<Item> = read
                .into_iter()
                .filter_map(|r| match r { Decoded::Known(i) => Some(i), Decoded::Unknown { .. } => None })
                .collect();
            prop_assert_eq!(known, items);
        }

        #[test]
        fn arbitrary_bytes_decode_or_give_an_error(bytes in vec(any::<u8>(), 0..1400)) {
            // Decoding returns (never panics, never allocates past the input); a known item
            // encodes again.
            if let Ok(Decoded::Known(item)) = decode_item(&bytes) {
                prop_assert!(encode_item(&item).is_ok());
            }
            prop_assert!(decode_items(&bytes).count() <= bytes.len());
            let _ = decode_want(&bytes);
        }

        #[test]
        fn arbitrary_fields_behind_a_valid_frame_decode_or_give_an_error(
            kind in 0u8..4,
            version in 0u8..4,
            fields in vec(any::<u8>(), 0..300),
        ) {
            let mut w = Writer::default();
            w.raw(&[kind, version]);
            let framed = w.record(|w| { w.raw(&fields); Ok(()) });
            prop_assert!(framed.is_ok());
            let bytes = w.into_bytes();
            let _ = decode_item(&bytes);
            prop_assert!(decode_items(&bytes).count() == 1);
        }

        #[test]
        fn a_damaged_item_decodes_or_gives_an_error(
            item in item(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            bits in 1u8..=255,
        ) {
            let mut bytes = encode_items([&item, &item]).unwrap_or_default();
            let at = flip.index(bytes.len());
            bytes[at] ^= bits;
            bytes.truncate(cut.index(bytes.len() + 1));
            let _ = decode_items(&bytes).count();
            let _ = decode_item(&bytes);
        }
    }
}
