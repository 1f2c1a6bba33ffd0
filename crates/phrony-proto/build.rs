//! Compiles `proto/` (at the workspace root) with protox, a pure-Rust protobuf
//! compiler, so no system `protoc` is needed. Writes into `OUT_DIR`:
//! - the prost messages and tonic client/server of every `phrony.*` package;
//! - `phrony_descriptor_set.bin`: the encoded `FileDescriptorSet` (with imports
//!   and comments) served by gRPC reflection.

#![allow(
    clippy::disallowed_methods,
    reason = "a build script reads what cargo sets in its environment (OUT_DIR, CARGO_MANIFEST_DIR)"
)]

use std::env;
use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

/// Proto files compiled into this crate, relative to the `proto/` root.
const PROTO_FILES: &[&str] = &["phrony/runtime/v1/runtime.proto"];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("phrony-proto: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // A directory makes cargo rescan every file below it.
    println!("cargo::rerun-if-changed={}", proto_root.display());

    // `Compiler::new` also resolves the google/protobuf well-known types that
    // protox bundles.
    let mut compiler = protox::Compiler::new([&proto_root]).map_err(describe)?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(PROTO_FILES).map_err(describe)?;

    // Reflection needs every file a service refers to, so the served set keeps
    // the imports (e.g. google/protobuf/struct.proto).
    std::fs::write(
        out_dir.join("phrony_descriptor_set.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    // prost-build needs the imported files to resolve types, but generates
    // nothing for them: the well-known types map to `prost_types` (its default
    // extern path). Only `phrony.runtime.v1.rs` is written.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}

/// Renders a protox error with its file, line and column (its `Display` alone
/// carries only the message).
fn describe(error: protox::Error) -> String {
    let mut report = String::new();
    match miette::NarratableReportHandler::new().render_report(&mut report, &error) {
        Ok(()) => report,
        Err(_) => error.to_string(),
    }
}
