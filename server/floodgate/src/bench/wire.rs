//! The load generator's side of the wire: requests are encoded once and sent
//! as bytes, and responses are decoded into small views that read only the
//! field that matters (prost skips the rest). The generator then costs the
//! machine it shares with the server as little as possible.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Sends pre-encoded bytes; decodes the response as `T`.
pub struct RawCodec<T>(PhantomData<T>);

pub struct BytesEncoder;

pub struct ViewDecoder<T>(PhantomData<T>);

impl<T> Default for RawCodec<T> {
    fn default() -> Self {
        RawCodec(PhantomData)
    }
}

impl<T: View> Codec for RawCodec<T> {
    type Encode = Bytes;
    type Decode = T;
    type Encoder = BytesEncoder;
    type Decoder = ViewDecoder<T>;

    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }

    fn decoder(&mut self) -> ViewDecoder<T> {
        ViewDecoder(PhantomData)
    }
}

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl<T: View> Decoder for ViewDecoder<T> {
    type Item = T;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<T>, Status> {
        T::read(src).map(Some)
    }
}

/// A response as it came over the wire, for tests that read fields by number.
#[derive(Clone, Debug, PartialEq)]
pub struct Raw(pub Bytes);

/// How a response view is read from its bytes.
pub trait View: Sized + Send + 'static {
    fn read(src: &mut DecodeBuf<'_>) -> Result<Self, Status>;
}

impl View for Raw {
    fn read(src: &mut DecodeBuf<'_>) -> Result<Self, Status> {
        Ok(Raw(src.copy_to_bytes(src.remaining())))
    }
}

fn read_message<T: Message + Default>(src: &mut DecodeBuf<'_>) -> Result<T, Status> {
    T::decode(src).map_err(|e| Status::internal(format!("decoding the response: {e}")))
}

/// `AcquireResponse.verdict`, `HealthCheckResponse.status`,
/// `RateLimitResponse.overall_code`, `ReportOutcomeResponse.counted`: all
/// field 1, all varints.
#[derive(Clone, PartialEq, Message)]
pub struct FirstVarint {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `AcquireBatchResponse`: field 1, repeated `AcquireResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct BatchVerdicts {
    #[prost(message, repeated, tag = "1")]
    pub responses: Vec<FirstVarint>,
}

impl View for FirstVarint {
    fn read(src: &mut DecodeBuf<'_>) -> Result<Self, Status> {
        read_message(src)
    }
}

impl View for BatchVerdicts {
    fn read(src: &mut DecodeBuf<'_>) -> Result<Self, Status> {
        read_message(src)
    }
}

/// `AcquireResponse`: the verdict and the permit, for acquire-then-report runs.
#[derive(Clone, PartialEq, Message)]
pub struct PermitView {
    #[prost(uint64, tag = "1")]
    pub verdict: u64,
    #[prost(string, tag = "2")]
    pub permit_id: String,
}

impl View for PermitView {
    fn read(src: &mut DecodeBuf<'_>) -> Result<Self, Status> {
        read_message(src)
    }
}
