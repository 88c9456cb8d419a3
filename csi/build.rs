//! Generates the CSI gRPC types and services from the vendored spec file. protox parses the proto in Rust
//! (it carries the google/protobuf imports itself), so no protoc is needed.
fn main() {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let descriptors = protox::compile(["proto/csi.proto"], ["proto"]).expect("csi.proto compiles");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Unimplemented for the RPCs we do not serve (controller, stage, stats, expand).
        .generate_default_stubs(true)
        .compile_fds(descriptors)
        .expect("CSI code generation");
}
