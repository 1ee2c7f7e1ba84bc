//! `Acquire` read in place: the request's resource and descriptors are
//! taken straight from the received bytes instead of the strings and the
//! hash map prost would build and drop on every call. A descriptors map
//! entry seen twice keeps its last value, as prost's map does; a request
//! with more distinct descriptors than a decision takes is left to prost,
//! so that its error says what prost's reading says.

use bytes::Bytes;
use floodgate_proto::v1 as pb;
use prost::Message;
use smallvec::SmallVec;

use super::wire::{RECURSION_LIMIT, WireError, field, nested, skip, string, varint};
use crate::rules::MAX_DESCRIPTORS;

/// The received bytes of one `AcquireRequest`.
#[derive(Clone, Debug, Default)]
pub(crate) struct AcquireWire(pub Bytes);

/// An `AcquireRequest`, its strings borrowed from the bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WireAcquire<'a> {
    pub resource: &'a str,
    /// Distinct keys, in the order first seen; a key seen again keeps its last value.
    pub descriptors: SmallVec<[(&'a str, &'a str); 4]>,
    pub cost: u32,
    pub dry_run: bool,
    pub settle: bool,
    pub priority: i32,
}

impl AcquireWire {
    /// Reads the request; `Ok(None)` when it holds more distinct descriptors
    /// than any decision takes, or usage (read it with [`decode`](Self::decode)).
    pub fn read(&self) -> Result<Option<WireAcquire<'_>>, WireError> {
        read(&self.0)
    }

    /// The request as prost decodes it.
    pub fn decode(&self) -> Result<pb::AcquireRequest, WireError> {
        Ok(Message::decode(self.0.clone())?)
    }
}

fn read(mut buf: &[u8]) -> Result<Option<WireAcquire<'_>>, WireError> {
    let mut r = WireAcquire::default();
    let mut too_many = false;
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => r.resource = string(wire, &mut buf)?,
            2 => {
                let (k, v) = entry(nested(wire, &mut buf)?)?;
                let distinct = r.descriptors.len();
                match r.descriptors.iter_mut().find(|(key, _)| *key == k) {
                    Some(seen) => seen.1 = v,
                    None if distinct < MAX_DESCRIPTORS => r.descriptors.push((k, v)),
                    // Read on to the end: the bytes may still be malformed.
                    None => too_many = true,
                }
            }
            3 => r.cost = varint(wire, &mut buf)? as u32,
            4 => r.dry_run = varint(wire, &mut buf)? != 0,
            5 => r.settle = varint(wire, &mut buf)? != 0,
            6 => r.priority = varint(wire, &mut buf)? as i32,
            // Usage is read by prost (the slow path): a call that reports
            // usage pays for a map, the others do not.
            7 => {
                nested(wire, &mut buf)?;
                too_many = true;
            }
            _ => skip(wire, tag, &mut buf, RECURSION_LIMIT)?,
        }
    }
    Ok((!too_many).then_some(r))
}

/// A map entry: key = 1, value = 2 (absent: empty).
fn entry(mut buf: &[u8]) -> Result<(&str, &str), WireError> {
    let (mut key, mut value) = ("", "");
    while !buf.is_empty() {
        let (tag, wire) = field(&mut buf)?;
        match tag {
            1 => key = string(wire, &mut buf)?,
            2 => value = string(wire, &mut buf)?,
            _ => skip(wire, tag, &mut buf, RECURSION_LIMIT - 1)?,
        }
    }
    Ok((key, value))
}

/// prost's reading, in the same shape (map entries in key order).
impl<'a> From<&'a pb::AcquireRequest> for WireAcquire<'a> {
    fn from(r: &'a pb::AcquireRequest) -> Self {
        let mut descriptors: SmallVec<[(&str, &str); 4]> =
            r.descriptors.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        descriptors.sort_unstable();
        WireAcquire {
            resource: &r.resource,
            descriptors,
            cost: r.cost,
            dry_run: r.dry_run,
            settle: r.settle,
            priority: r.priority,
        }
    }
}

#[cfg(test)]
mod tests;
