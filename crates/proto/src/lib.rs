//! gyre-proto: code generated from `proto/*.proto` by prost-build, and the gRPC codec the
//! generated services use.
//!
//! Domain types live in `gyre-event`; conversions between them and these messages live at the
//! edge, in `gyre-log` (module `codec`). Keeping generated code in this one crate means pure
//! crates never compile prost, and a schema change rebuilds exactly one crate.

/// `proto/events.proto`: the event envelope (`EventBatch`, `EventRecord`) and one body message
/// per event kind.
#[allow(clippy::all, missing_docs)]
pub mod events {
    include!(concat!(env!("OUT_DIR"), "/gyre.events.rs"));
}

/// `proto/control.proto`: the Raft transport and the control API (tonic clients and servers).
#[allow(clippy::all, missing_docs)]
pub mod control {
    include!(concat!(env!("OUT_DIR"), "/gyre.control.rs"));
}

/// The gRPC codec of the control services: prost messages, encoded into a buffer reserved for
/// the message's exact length first. tonic's prost encoder writes into an 8 KiB buffer that
/// grows by doubling as fields are written, so an AppendEntries carrying megabytes of token
/// records was copied several times into ever larger fresh allocations (page faults were the
/// largest cost of the token benchmark). Decoding is tonic-prost's.
pub mod codec {
    use std::marker::PhantomData;

    use prost::Message;
    use tonic::codec::{Codec, EncodeBuf, Encoder};
    use tonic::Status;

    /// A [`Codec`] that is tonic-prost's `ProstCodec` with a reserving encoder.
    #[derive(Debug, Clone, Copy)]
    pub struct ReservingCodec<T, U>(PhantomData<(T, U)>);

    impl<T, U> Default for ReservingCodec<T, U> {
        fn default() -> Self {
            Self(PhantomData)
        }
    }

    impl<T, U> Codec for ReservingCodec<T, U>
    where
        T: Message + Send + 'static,
        U: Message + Default + Send + 'static,
    {
        type Encode = T;
        type Decode = U;
        type Encoder = ReservingEncoder<T>;
        type Decoder = tonic_prost::ProstDecoder<U>;

        fn encoder(&mut self) -> Self::Encoder {
            ReservingEncoder(PhantomData)
        }

        fn decoder(&mut self) -> Self::Decoder {
            tonic_prost::ProstDecoder::default()
        }
    }

    /// Reserves the message's encoded length, then encodes it.
    #[derive(Debug, Clone, Copy)]
    pub struct ReservingEncoder<T>(PhantomData<T>);

    impl<T: Message> Encoder for ReservingEncoder<T> {
        type Item = T;
        type Error = Status;

        fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
            buf.reserve(item.encoded_len());
            item.encode(buf)
                .map_err(|error| Status::internal(format!("encoding a message: {error}")))
        }
    }
}
