//! Reading protobuf in place: the primitives of the request readers that
//! take names straight from the received bytes (see
//! [`envoy::wire`](super::envoy::wire) and [`acquire`](super::acquire)),
//! following prost's rules exactly: the same varints and keys (prost's own
//! functions), unknown fields skipped the same way (groups included, with
//! the same recursion limit), strings checked for UTF-8.

use bytes::Buf;
use prost::encoding::{WireType, check_wire_type, decode_key, decode_varint};

/// Why bytes are not the message, in prost's words.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Prost(#[from] prost::DecodeError),
    #[error("buffer underflow")]
    Underflow,
    #[error("invalid string value: data is not UTF-8 encoded")]
    NotUtf8,
    #[error("recursion limit reached")]
    Recursion,
    #[error("unexpected end group tag")]
    EndGroup,
}

/// prost's recursion limit, at a message's top level.
pub(crate) const RECURSION_LIMIT: u32 = 100;

/// A length-delimited field's bytes.
pub fn nested<'a>(wire: WireType, buf: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
    check_wire_type(WireType::LengthDelimited, wire)?;
    let len = decode_varint(buf)?;
    if len > buf.len() as u64 {
        return Err(WireError::Underflow);
    }
    let (field, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(field)
}

/// A string field, UTF-8 checked.
pub fn string<'a>(wire: WireType, buf: &mut &'a [u8]) -> Result<&'a str, WireError> {
    let bytes = nested(wire, buf)?;
    std::str::from_utf8(bytes).map_err(|_| WireError::NotUtf8)
}

/// Skips an unknown field as prost does, groups included, with what is left
/// of the recursion limit.
pub fn skip(wire: WireType, tag: u32, buf: &mut &[u8], depth: u32) -> Result<(), WireError> {
    if depth == 0 {
        return Err(WireError::Recursion);
    }
    let len = match wire {
        WireType::Varint => decode_varint(buf).map(|_| 0)?,
        WireType::ThirtyTwoBit => 4,
        WireType::SixtyFourBit => 8,
        WireType::LengthDelimited => decode_varint(buf)?,
        WireType::StartGroup => loop {
            let (inner, inner_wire) = decode_key(buf)?;
            match inner_wire {
                WireType::EndGroup if inner == tag => break 0,
                WireType::EndGroup => return Err(WireError::EndGroup),
                _ => skip(inner_wire, inner, buf, depth - 1)?,
            }
        },
        WireType::EndGroup => return Err(WireError::EndGroup),
    };
    if len > buf.len() as u64 {
        return Err(WireError::Underflow);
    }
    buf.advance(len as usize);
    Ok(())
}

/// A varint field's value (any scalar number or bool, as prost reads it).
pub fn varint(wire: WireType, buf: &mut &[u8]) -> Result<u64, WireError> {
    check_wire_type(WireType::Varint, wire)?;
    Ok(decode_varint(buf)?)
}

/// The fields of a message, one at a time: (tag, wire type), the buffer
/// left at the field's value.
pub fn field(buf: &mut &[u8]) -> Result<(u32, WireType), WireError> {
    Ok(decode_key(buf)?)
}
