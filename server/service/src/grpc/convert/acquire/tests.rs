//! `Acquire` read in place against prost's reading of the same bytes:
//! generated requests, requests merged from two (map entries overwritten,
//! the last scalar winning), unknown fields, corruptions, and requests with
//! more distinct descriptors than a decision takes.

use proptest::prelude::*;

use super::*;

fn request() -> impl Strategy<Value = pb::AcquireRequest> {
    (
        prop_oneof![Just(String::new()), "[a-z./-]{1,12}", ".{0,8}"],
        prop::collection::hash_map(prop_oneof!["[a-c]", "[a-z]{1,4}", ".{0,3}"], ".{0,6}", 0..6),
        any::<u32>(),
        any::<bool>(),
        any::<bool>(),
        -1..6i32,
        prop_oneof![
            3 => Just(std::collections::HashMap::new()),
            1 => prop::collection::hash_map("[a-z_]{1,6}", any::<u64>(), 1..3),
        ],
    )
        .prop_map(|(resource, descriptors, cost, dry_run, settle, priority, usage)| pb::AcquireRequest {
            resource,
            descriptors,
            cost,
            dry_run,
            settle,
            priority,
            usage,
        })
}

/// Our reading, with its descriptors sorted as prost's map is compared.
fn ours(bytes: &[u8]) -> Result<Option<WireAcquire<'_>>, WireError> {
    let mut r = read(bytes)?;
    if let Some(r) = r.as_mut() {
        r.descriptors.sort_unstable();
    }
    Ok(r)
}

/// Both readings agree: the same request, prost's holding too many
/// descriptors or usage when ours hands the request to prost, or both
/// refuse (ours may hand to prost a request with usage that prost refuses).
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    let got = ours(bytes);
    let prost = pb::AcquireRequest::decode(bytes);
    match (&prost, got) {
        (Ok(r), Ok(Some(ours))) => prop_assert_eq!(ours, WireAcquire::from(r)),
        (Ok(r), Ok(None)) => prop_assert!(r.descriptors.len() > MAX_DESCRIPTORS || !r.usage.is_empty()),
        (Ok(_), Err(e)) => prop_assert!(false, "prost read what we refused: {e:?}"),
        (Err(_), Ok(None)) => {}
        (Err(_), got) => prop_assert!(got.is_err(), "prost refused {:?}", bytes),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn well_formed_requests_read_as_prost_reads_them(r in request()) {
        agree(&r.encode_to_vec())?;
    }

    #[test]
    fn two_requests_concatenated_merge_as_prost_merges_them(a in request(), b in request()) {
        agree(&[a.encode_to_vec(), b.encode_to_vec()].concat())?;
    }

    #[test]
    fn unknown_fields_are_skipped(r in request(), tag in 8..3000u32, v in any::<u64>(), bytes in prop::collection::vec(any::<u8>(), 0..6)) {
        let mut extra = Vec::new();
        prost::encoding::uint64::encode(tag, &v, &mut extra);
        prost::encoding::bytes::encode(tag + 1, &bytes, &mut extra);
        agree(&[extra.clone(), r.encode_to_vec(), extra].concat())?;
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
fn more_distinct_descriptors_than_a_decision_takes_are_left_to_prost() {
    let many = |n: usize| pb::AcquireRequest {
        resource: "api".into(),
        descriptors: (0..n).map(|i| (format!("k{i}"), "v".to_string())).collect(),
        ..Default::default()
    };
    assert!(read(&many(MAX_DESCRIPTORS).encode_to_vec()).unwrap().is_some());
    assert!(read(&many(MAX_DESCRIPTORS + 1).encode_to_vec()).unwrap().is_none());
    // The same key ten thousand times is one descriptor.
    let mut bytes = Vec::new();
    for i in 0..10_000 {
        let one = pb::AcquireRequest { descriptors: [("user".into(), i.to_string())].into(), ..Default::default() };
        bytes.extend(one.encode_to_vec());
    }
    let r = read(&bytes).unwrap().unwrap();
    assert_eq!(r.descriptors.as_slice(), [("user", "9999")], "the last value wins");
}
