//! Compiles `proto/*.proto` into Rust with prost-build, using the protoc binary vendored by
//! `protoc-bin-vendored` so that a fresh machine needs no system protoc. `control.proto` also gets
//! tonic client and server stubs (tonic-prost-build).

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo always sets CARGO_MANIFEST_DIR"),
    );
    let proto_dir = manifest_dir.join("../../proto");
    let events = proto_dir.join("events.proto");
    let control = proto_dir.join("control.proto");
    println!("cargo:rerun-if-changed={}", events.display());
    println!("cargo:rerun-if-changed={}", control.display());

    let protoc = protoc_bin_vendored::protoc_bin_path()
        .expect("protoc-bin-vendored ships a protoc binary for this host");
    // prost-build finds protoc through PROTOC; a build script is single-threaded, so setting
    // it here is race-free.
    std::env::set_var("PROTOC", protoc);

    prost_build::Config::new()
        // Record bodies and token arrays as `bytes::Bytes`: decoding a batch from one `Bytes`
        // then slices it instead of allocating and copying every body and every token array.
        .bytes([".gyre.events.EventRecord.body", ".gyre.events.ModelCall"])
        .compile_protos(&[events], std::slice::from_ref(&proto_dir))
        .expect("proto/events.proto compiles (see the protoc error above)");

    // The control API (gRPC services): tonic client and server stubs over prost messages.
    tonic_prost_build::configure()
        // Reserves each message's length before encoding it (see `codec` in lib.rs).
        .codec_path("crate::codec::ReservingCodec")
        // The batch fields as `bytes::Bytes`: an entry's batch is handed to the encoder by
        // reference count instead of copied into a Vec, and decoding slices the message buffer.
        .bytes(".gyre.control.RaftEntry.batch")
        .bytes(".gyre.control.AppendEventsRequest.batch")
        .compile_protos(&[control], &[proto_dir])
        .expect("proto/control.proto compiles (see the protoc error above)");
}
