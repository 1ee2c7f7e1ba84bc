//! The request read in place against prost's reading of the same bytes, and
//! the answer written in place against prost's writing of the same message:
//! generated messages, messages with unknown fields, repeated scalars and
//! embedded messages (merged), and random corruptions of them.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value, value::Kind};
use proptest::prelude::*;
use prost::encoding::decode_key;

use super::*;
use crate::decider::Shown;
use crate::rules::envoy::Unit;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z_]{1,6}", ".{0,12}"]
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec((text(), text()), 0..5),
        prop::option::of((any::<u32>(), -2..9i32)),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries: entries.into_iter().map(|(key, value)| Entry { key, value }).collect(),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride { requests_per_unit, unit }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    (text(), prop::collection::vec(descriptor(), 0..4), any::<u32>())
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest { domain, descriptors, hits_addend })
}

/// Both readings of `bytes` agree: the same request, or both refuse.
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    let ours = read_request(bytes);
    match RateLimitRequest::decode(bytes) {
        Ok(r) => prop_assert_eq!(ours.expect("prost read it"), WireRequest::from(&r)),
        Err(_) => prop_assert!(ours.is_err(), "prost refused {:?}, we read {:?}", bytes, ours),
    }
    Ok(())
}

/// A field no message here has, of each wire type.
fn unknown() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (10..2000u32, any::<u64>()).prop_map(|(tag, v)| {
            let mut b = Vec::new();
            encode_key(tag, WireType::Varint, &mut b);
            encode_varint(v, &mut b);
            b
        }),
        (10..2000u32, prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(tag, v)| {
            let mut b = Vec::new();
            prost::encoding::bytes::encode(tag, &v, &mut b);
            b
        }),
        (10..2000u32, any::<u32>()).prop_map(|(tag, v)| {
            let mut b = Vec::new();
            encode_key(tag, WireType::ThirtyTwoBit, &mut b);
            b.put_u32_le(v);
            b
        }),
        (10..2000u32, any::<u64>()).prop_map(|(tag, v)| {
            let mut b = Vec::new();
            encode_key(tag, WireType::SixtyFourBit, &mut b);
            b.put_u64_le(v);
            b
        }),
        (10..2000u32, any::<u8>()).prop_map(|(tag, v)| {
            let mut b = Vec::new();
            encode_key(tag, WireType::StartGroup, &mut b);
            encode_key(tag + 1, WireType::Varint, &mut b);
            encode_varint(u64::from(v), &mut b);
            encode_key(tag, WireType::EndGroup, &mut b);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn well_formed_requests_read_as_prost_reads_them(r in request()) {
        agree(&r.encode_to_vec())?;
    }

    #[test]
    fn two_messages_concatenated_merge_as_prost_merges_them(a in request(), b in request()) {
        agree(&[a.encode_to_vec(), b.encode_to_vec()].concat())?;
    }

    #[test]
    fn unknown_fields_anywhere_are_skipped(r in request(), extra in unknown(), at in any::<prop::sample::Index>()) {
        let bytes = r.encode_to_vec();
        // Between fields of the request (or at the end).
        let mut cuts = vec![0];
        let mut rest: &[u8] = &bytes;
        while !rest.is_empty() {
            let (tag, wire) = decode_key(&mut rest).unwrap();
            skip(wire, tag, &mut rest, RECURSION_LIMIT).unwrap();
            cuts.push(bytes.len() - rest.len());
        }
        let cut = cuts[at.index(cuts.len())];
        agree(&[&bytes[..cut], &extra, &bytes[cut..]].concat())?;
    }

    #[test]
    fn corrupted_bytes_are_refused_or_read_as_prost_reads_them(
        r in request(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = r.encode_to_vec();
        if bytes.is_empty() {
            bytes.push(0x0a);
        }
        for (at, v) in flips {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        agree(&bytes)?;
        agree(&bytes[..cut.index(bytes.len() + 1)])?;
    }

    #[test]
    fn random_bytes_are_refused_or_read_as_prost_reads_them(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        agree(&bytes)?;
    }
}

#[test]
fn groups_nested_past_the_recursion_limit_are_refused_as_prost_refuses_them() {
    for depth in [90, 97, 98, 99, 100, 101] {
        let mut group = Vec::new();
        for _ in 0..depth {
            encode_key(20, WireType::StartGroup, &mut group);
        }
        for _ in 0..depth {
            encode_key(20, WireType::EndGroup, &mut group);
        }
        // At the request's level, in a descriptor, and in an entry.
        let mut entry = Vec::new();
        prost::encoding::bytes::encode(1, &group, &mut entry);
        let mut descriptor = group.clone();
        prost::encoding::bytes::encode(1, &group, &mut descriptor);
        for bytes in [group.clone(), [vec![0x12], encoded(&descriptor)].concat(), {
            let mut d = Vec::new();
            prost::encoding::bytes::encode(1, &group, &mut d);
            [vec![0x12], encoded(&d)].concat()
        }] {
            agree(&bytes).unwrap();
        }
    }
}

/// A length prefix and the bytes.
fn encoded(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_varint(b.len() as u64, &mut out);
    out.extend_from_slice(b);
    out
}

fn status() -> impl Strategy<Value = RlsStatus> {
    let unit = prop::sample::select(Unit::ALL.to_vec());
    (
        any::<bool>(),
        prop::option::of((".{0,10}", any::<u32>(), unit)),
        any::<u32>(),
        prop::option::of(prop_oneof![Just(0u64), any::<u64>()].prop_map(std::time::Duration::from_secs)),
    )
        .prop_map(|(over, limit, remaining, reset)| RlsStatus {
            over,
            limit: limit.map(|(name, requests_per_unit, unit)| Shown { name: name.into(), requests_per_unit, unit }),
            remaining,
            reset,
            quota: false,
        })
}

/// prost's message for the same answer.
fn prost_response(reply: &RlsReply) -> RateLimitResponse {
    let a = &reply.answer;
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    RateLimitResponse {
        overall_code: code(a.over),
        statuses: a
            .statuses
            .iter()
            .map(|s| DescriptorStatus {
                code: code(s.over),
                current_limit: s.limit.as_ref().map(|l| RateLimit {
                    name: l.name.to_string(),
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit as i32,
                }),
                limit_remaining: s.remaining,
                duration_until_reset: s.reset.map(crate::grpc::convert::envoy::duration),
                quota: None,
            })
            .collect(),
        response_headers_to_add: a
            .headers
            .iter()
            .map(|(k, v)| envoy_types::pb::envoy::config::core::v3::HeaderValue {
                key: k.to_string(),
                value: v.clone(),
                ..Default::default()
            })
            .collect(),
        dynamic_metadata: reply.metadata.clone(),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn answers_are_written_byte_for_byte_as_prost_writes_them(
        over in any::<bool>(),
        statuses in prop::collection::vec(status(), 0..4),
        headers in prop::collection::vec((prop::sample::select(vec!["RateLimit-Limit", "x-a", ""]), ".{0,8}"), 0..3),
        metadata in prop::option::of(".{0,8}"),
    ) {
        let answer = RlsAnswer {
            over,
            statuses: statuses.into(),
            headers,
            metadata: Vec::new(),
        };
        let metadata = metadata.map(|v| Struct {
            fields: [("k".to_string(), Value { kind: Some(Kind::StringValue(v)) })].into(),
        });
        let reply = RlsReply { answer, metadata };
        let mut ours = Vec::new();
        reply.write(&mut ours);
        prop_assert_eq!(ours, prost_response(&reply).encode_to_vec());
    }
}

#[test]
fn units_go_out_with_envoys_numbers() {
    for (unit, name) in [(Unit::Week, "WEEK"), (Unit::Month, "MONTH"), (Unit::Year, "YEAR"), (Unit::Second, "SECOND")] {
        let status = RlsStatus {
            over: false,
            limit: Some(Shown { name: Default::default(), requests_per_unit: 1, unit }),
            remaining: 0,
            reset: None,
            quota: false,
        };
        let reply = RlsReply {
            answer: RlsAnswer {
                over: false,
                statuses: SmallVec::from_elem(status, 1),
                headers: Vec::new(),
                metadata: Vec::new(),
            },
            metadata: None,
        };
        let mut bytes = Vec::new();
        reply.write(&mut bytes);
        let decoded = RateLimitResponse::decode(bytes.as_slice()).unwrap();
        let unit = decoded.statuses[0].current_limit.as_ref().unwrap().unit();
        assert_eq!(unit.as_str_name(), name);
    }
    // And a limit Envoy sends: MONTH is 5 there too.
    assert_eq!(Unit::from_number(5), Some(Unit::Month));
    assert_eq!(Unit::from_number(6), Some(Unit::Year));
    assert_eq!(Unit::from_number(7), Some(Unit::Week));
}
