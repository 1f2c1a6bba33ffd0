//! Compiles `proto/grpc/health/v1/health.proto` (this crate's copy of the health protocol, with
//! the SDKs' `List`) with protox, so no system `protoc` is needed. Writes into `OUT_DIR` the
//! prost messages and tonic server (`grpc.health.v1.rs`) and `health_descriptor_set.bin` for
//! server reflection.

#![allow(
    clippy::disallowed_methods,
    reason = "a build script reads what cargo sets in its environment (OUT_DIR, CARGO_MANIFEST_DIR)"
)]

use std::env;
use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

const PROTO_FILES: &[&str] = &["grpc/health/v1/health.proto"];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("phrony-grpc: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let proto_root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    println!("cargo::rerun-if-changed={}", proto_root.display());

    let mut compiler = protox::Compiler::new([&proto_root])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(PROTO_FILES)?;
    std::fs::write(
        out_dir.join("health_descriptor_set.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
