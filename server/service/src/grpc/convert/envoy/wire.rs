//! `ShouldRateLimit` on the wire, read and written in place: the request is
//! read straight from the received bytes (names borrowed, not copied into
//! the strings and vectors prost would build and drop on every call), and
//! the answer is written straight from the decision. Both follow protobuf's
//! rules exactly as prost applies them (unknown fields skipped, the last of
//! a scalar wins, an embedded message seen twice merges, strings must be
//! UTF-8, the same recursion limit); the tests hold them to prost byte for
//! byte, and the fuzzer compares every input with prost's reading of it.

use bytes::{BufMut, Bytes};
use envoy_types::pb::google::protobuf::Struct;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use smallvec::SmallVec;

use crate::decider::{RlsAnswer, RlsStatus};
pub use crate::grpc::convert::wire::WireError;
use crate::grpc::convert::wire::{RECURSION_LIMIT, field, nested, skip, string, varint as number};

/// The received bytes of one `RateLimitRequest`.
#[derive(Clone, Debug, Default)]
pub struct RlsWire(pub Bytes);

/// A `RateLimitRequest`, its strings borrowed from the bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireRequest<'a> {
    pub domain: &'a str,
    pub descriptors: SmallVec<[WireDescriptor<'a>; 2]>,
    pub hits_addend: u32,
}

/// A `RateLimitDescriptor`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireDescriptor<'a> {
    pub entries: SmallVec<[(&'a str, &'a str); 4]>,
    /// `limit`: requests per unit and the unit's number, when present.
    pub limit: Option<(u32, i32)>,
    /// `hits_addend`, when present.
    pub hits_addend: Option<u64>,
    pub is_negative_hits: bool,
}

/// prost's reading, in the same shape (for the tests and the fuzzer).
impl<'a> From<&'a envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest> for WireRequest<'a> {
    fn from(r: &'a envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest) -> Self {
        let descriptors = r.descriptors.iter().map(|d| WireDescriptor {
            entries: d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect(),
            limit: d.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
            hits_addend: d.hits_addend.as_ref().map(|h| h.value),
            is_negative_hits: d.is_negative_hits,
        });
        WireRequest { domain: &r.domain, descriptors: descriptors.collect(), hits_addend: r.hits_addend }
    }
}

impl RlsWire {
    /// Reads the request; an error is what prost would have refused.
    pub fn read(&self) -> Result<WireRequest<'_>, WireError> {
        read_request(&self.0)
    }

    /// The request as prost decodes it (for the dynamic metadata's echo).
    pub fn decode(&self) -> Result<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest, WireError> {
        Ok(Message::decode(self.0.clone())?)
    }
}

fn read_request(mut buf: &[u8]) -> Result<WireRequest<'_>, WireError> {
    let mut r = WireRequest::default();
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => r.domain = string(wire, &mut buf)?,
            2 => r.descriptors.push(descriptor(nested(wire, &mut buf)?)?),
            3 => r.hits_addend = number(wire, &mut buf)? as u32,
            _ => skip(wire, tag, &mut buf, RECURSION_LIMIT)?,
        }
    }
    Ok(r)
}

fn descriptor(mut buf: &[u8]) -> Result<WireDescriptor<'_>, WireError> {
    let mut d = WireDescriptor::default();
    let depth = RECURSION_LIMIT - 1;
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => d.entries.push(entry(nested(wire, &mut buf)?, depth - 1)?),
            2 => d.limit = Some(limit(nested(wire, &mut buf)?, d.limit.unwrap_or_default(), depth - 1)?),
            3 => d.hits_addend = Some(wrapped(nested(wire, &mut buf)?, d.hits_addend.unwrap_or_default(), depth - 1)?),
            4 => d.is_negative_hits = number(wire, &mut buf)? != 0,
            _ => skip(wire, tag, &mut buf, depth)?,
        }
    }
    Ok(d)
}

fn entry(mut buf: &[u8], depth: u32) -> Result<(&str, &str), WireError> {
    let (mut key, mut value) = ("", "");
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => key = string(wire, &mut buf)?,
            2 => value = string(wire, &mut buf)?,
            _ => skip(wire, tag, &mut buf, depth)?,
        }
    }
    Ok((key, value))
}

/// `RateLimitOverride`, merged into what an earlier occurrence set.
fn limit(mut buf: &[u8], (mut per_unit, mut unit): (u32, i32), depth: u32) -> Result<(u32, i32), WireError> {
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => per_unit = number(wire, &mut buf)? as u32,
            2 => unit = number(wire, &mut buf)? as i32,
            _ => skip(wire, tag, &mut buf, depth)?,
        }
    }
    Ok((per_unit, unit))
}

/// `google.protobuf.UInt64Value`, merged into an earlier occurrence's.
fn wrapped(mut buf: &[u8], mut value: u64, depth: u32) -> Result<u64, WireError> {
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => value = number(wire, &mut buf)?,
            _ => skip(wire, tag, &mut buf, depth)?,
        }
    }
    Ok(value)
}

// === The answer ===

/// A `RateLimitResponse` to write: the decision, and the dynamic metadata
/// when it carries any.
#[derive(Debug)]
pub struct RlsReply {
    pub answer: RlsAnswer,
    pub metadata: Option<Struct>,
}

/// `Code`: OK is 1, OVER_LIMIT 2.
fn code(over: bool) -> u64 {
    if over { 2 } else { 1 }
}

fn varint_len(tag: u32, v: u64) -> usize {
    if v == 0 { 0 } else { key_len(tag) + encoded_len_varint(v) }
}

fn varint(tag: u32, v: u64, buf: &mut impl BufMut) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }
}

fn bytes_len(tag: u32, len: usize) -> usize {
    if len == 0 { 0 } else { nested_len(tag, len) }
}

fn nested_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn bytes(tag: u32, b: &[u8], buf: &mut impl BufMut) {
    if !b.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(b.len() as u64, buf);
        buf.put_slice(b);
    }
}

fn header(tag: u32, len: usize, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// `RateLimit`: requests_per_unit = 1, unit = 2, name = 3.
fn limit_len(s: &RlsStatus) -> Option<usize> {
    let l = s.limit.as_ref()?;
    Some(varint_len(1, u64::from(l.requests_per_unit)) + varint_len(2, l.unit as u64) + bytes_len(3, l.name.len()))
}

/// `google.protobuf.Duration`: seconds = 1, nanos = 2.
fn duration_len(d: std::time::Duration) -> usize {
    varint_len(1, d.as_secs()) + varint_len(2, u64::from(d.subsec_nanos()))
}

/// `DescriptorStatus`: code = 1, current_limit = 2, limit_remaining = 3,
/// duration_until_reset = 4.
fn status_len(s: &RlsStatus) -> usize {
    varint_len(1, code(s.over))
        + limit_len(s).map_or(0, |n| nested_len(2, n))
        + varint_len(3, u64::from(s.remaining))
        + s.reset.map_or(0, |d| nested_len(4, duration_len(d)))
}

fn status(s: &RlsStatus, buf: &mut impl BufMut) {
    varint(1, code(s.over), buf);
    if let (Some(l), Some(len)) = (&s.limit, limit_len(s)) {
        header(2, len, buf);
        varint(1, u64::from(l.requests_per_unit), buf);
        varint(2, l.unit as u64, buf);
        bytes(3, l.name.as_bytes(), buf);
    }
    varint(3, u64::from(s.remaining), buf);
    if let Some(d) = s.reset {
        header(4, duration_len(d), buf);
        varint(1, d.as_secs(), buf);
        varint(2, u64::from(d.subsec_nanos()), buf);
    }
}

/// `HeaderValue`: key = 1, value = 2.
fn header_len(k: &str, v: &str) -> usize {
    bytes_len(1, k.len()) + bytes_len(2, v.len())
}

impl RlsReply {
    /// The response as prost would write it: overall_code = 1, statuses =
    /// 2, response_headers_to_add = 3, dynamic_metadata = 6.
    pub fn write(&self, buf: &mut impl BufMut) {
        let a = &self.answer;
        varint(1, code(a.over), buf);
        for s in &a.statuses {
            header(2, status_len(s), buf);
            status(s, buf);
        }
        for (k, v) in &a.headers {
            header(3, header_len(k, v), buf);
            bytes(1, k.as_bytes(), buf);
            bytes(2, v.as_bytes(), buf);
        }
        if let Some(m) = &self.metadata {
            prost::encoding::message::encode(6, m, buf);
        }
    }
}

impl crate::grpc::unary::Reply for RlsReply {
    fn write(&self, buf: &mut bytes::BytesMut) {
        RlsReply::write(self, buf);
    }

    fn size_hint(&self) -> usize {
        16 + 48 * self.answer.statuses.len()
    }
}

#[cfg(test)]
mod tests;
