//! Protobuf messages and gRPC client/server code for `phrony.runtime.v1`.
//!
//! The source of truth is `proto/phrony/runtime/v1/runtime.proto` at the
//! workspace root. It is wire-compatible with the `phrony.runtime.v1.Runtime`
//! service of the published SDKs (checked by `tests/python/test_proto_compat.py`
//! against the descriptor embedded in the `phrony` 0.1.0 Python package). The
//! build script compiles it with protox (no system `protoc`) and generates
//! prost messages plus tonic client and server code.
//!
//! - [`runtime::v1`]: all messages and enums, [`runtime::v1::runtime_server`]
//!   (the `Runtime` trait and `RuntimeServer` to implement the daemon) and
//!   [`runtime::v1::runtime_client`] (`RuntimeClient`).
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors for gRPC server
//!   reflection (`tonic_reflection`), so tools such as `grpcurl` can discover
//!   the API.
//!
//! gRPC health (`grpc.health.v1`) is not compiled here: use `tonic-health`,
//! which ships its own generated code and descriptor set.
//!
//! This crate holds only generated wire types. Conversions between these and
//! domain types belong to the gRPC edge (`phrony-grpc`).

/// The `phrony.runtime` protobuf package.
pub mod runtime {
    /// `phrony.runtime.v1`: the runtime daemon's API, generated from
    /// `proto/phrony/runtime/v1/runtime.proto`.
    #[allow(
        clippy::large_enum_variant,
        clippy::allow_attributes_without_reason,
        clippy::too_many_lines,
        reason = "generated code: prost generates oneofs as plain enums (boxing variants would change \
                  the generated API), tonic's generated `#[allow]`s carry no reasons, and its service \
                  dispatch is one long match"
    )]
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/phrony.runtime.v1.rs"));
    }
}

/// Encoded `google.protobuf.FileDescriptorSet` of every file in `proto/` and
/// of the files they import (with source comments), for gRPC server reflection:
/// `tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/phrony_descriptor_set.bin"));

/// Fully-qualified name of the runtime service, as used in gRPC paths, health
/// checks and reflection.
pub const RUNTIME_SERVICE_NAME: &str = runtime::v1::runtime_server::SERVICE_NAME;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use prost::Message;
    use prost_types::{FileDescriptorProto, FileDescriptorSet, ServiceDescriptorProto};

    use super::*;

    /// The 29 RPCs of the published `phrony.runtime.v1.Runtime` service.
    const PUBLISHED_RPCS: [&str; 29] = [
        "GetVersion",
        "RunSession",
        "RunSessionInteractive",
        "Publish",
        "PublishBundle",
        "Deploy",
        "DeployBundle",
        "Rollback",
        "GetActiveVersion",
        "GetActiveBundle",
        "GetBundleSecretRequirements",
        "ListBundles",
        "ListBundleVersions",
        "ListBundleDeployments",
        "ListDeployments",
        "GetAgentVersion",
        "RetireAgentVersion",
        "CancelSession",
        "CompleteSession",
        "ListAgents",
        "ListAgentVersions",
        "ListSessions",
        "InspectSession",
        "GetApproval",
        "ListApprovals",
        "DecideApproval",
        "DeprecateAgentVersion",
        "ArchiveAgent",
        "Work",
    ];

    fn descriptor_set() -> FileDescriptorSet {
        FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap()
    }

    fn file<'a>(set: &'a FileDescriptorSet, name: &str) -> &'a FileDescriptorProto {
        set.file
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("{name} is not in FILE_DESCRIPTOR_SET"))
    }

    fn runtime_service(set: &FileDescriptorSet) -> &ServiceDescriptorProto {
        let file = file(set, "phrony/runtime/v1/runtime.proto");
        assert_eq!(file.package(), "phrony.runtime.v1");
        let services: Vec<_> = file.service.iter().map(|s| s.name()).collect();
        assert_eq!(services, ["Runtime"]);
        &file.service[0]
    }

    /// The RPCs phrony-rs adds to the published service.
    const ADDED_RPCS: [&str; 9] = [
        "GetSessionPayload",
        "WatchApprovals",
        "VerifyAudit",
        "ExportAudit",
        "RollbackBundle",
        "GetBundleVersion",
        "ListShadowDecisions",
        "ListWebhookDeliveries",
        "RetryWebhookDelivery",
    ];

    #[test]
    fn runtime_service_has_exactly_the_published_rpcs_and_our_additions() {
        let set = descriptor_set();
        let methods: BTreeSet<&str> = runtime_service(&set)
            .method
            .iter()
            .map(|m| m.name())
            .collect();
        let expected: BTreeSet<&str> = PUBLISHED_RPCS.into_iter().chain(ADDED_RPCS).collect();
        assert_eq!(methods, expected);
        assert_eq!(RUNTIME_SERVICE_NAME, "phrony.runtime.v1.Runtime");
    }

    #[test]
    fn only_the_session_work_payload_watch_and_export_streams_are_streaming() {
        let set = descriptor_set();
        let streaming: Vec<(&str, bool, bool)> = runtime_service(&set)
            .method
            .iter()
            .filter(|m| m.client_streaming() || m.server_streaming())
            .map(|m| (m.name(), m.client_streaming(), m.server_streaming()))
            .collect();
        assert_eq!(
            streaming,
            [
                ("RunSessionInteractive", true, true),
                ("GetSessionPayload", false, true),
                ("WatchApprovals", false, true),
                ("Work", true, true),
                ("ExportAudit", false, true)
            ]
        );
    }

    #[test]
    fn descriptor_set_carries_imports_and_comments_for_reflection() {
        let set = descriptor_set();
        let runtime = file(&set, "phrony/runtime/v1/runtime.proto");
        for dependency in &runtime.dependency {
            file(&set, dependency);
        }
        assert!(
            runtime
                .dependency
                .iter()
                .any(|d| d == "google/protobuf/struct.proto"),
            "InspectSession uses google.protobuf.Value"
        );
        let comments = runtime
            .source_code_info
            .as_ref()
            .map(|info| info.location.len())
            .unwrap_or_default();
        assert!(comments > 0, "source info (comments) should be kept");
    }

    #[test]
    fn additions_round_trip_on_the_wire() {
        use runtime::v1::{AgentRef, RunSessionRequest, SessionMode};

        let request = RunSessionRequest {
            agent_ref: Some(AgentRef {
                namespace: "support".into(),
                name: "refund-agent".into(),
                version: String::new(),
            }),
            input: br#"{"message":"hi"}"#.to_vec(),
            metadata: [("ticket_id".to_owned(), "T-1".to_owned())].into(),
            mode: SessionMode::Conversation.into(),
            ..Default::default()
        };
        let decoded = RunSessionRequest::decode(request.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, request);

        // The documented field numbers, byte for byte: metadata = 5 (a map
        // entry {1: key, 2: value}), mode = 6 (varint).
        let wire = [
            0x2a, 0x0e, 0x0a, 0x09, b't', b'i', b'c', b'k', b'e', b't', b'_', b'i', b'd', 0x12,
            0x01, b'7', 0x30, 0x02,
        ];
        let decoded = RunSessionRequest::decode(&wire[..]).unwrap();
        assert_eq!(
            decoded.metadata.get("ticket_id").map(String::as_str),
            Some("7")
        );
        assert_eq!(decoded.mode(), SessionMode::Conversation);

        // A client that predates `mode` sends nothing: the enum's zero value.
        let legacy = RunSessionRequest::decode(&[][..]).unwrap();
        assert_eq!(legacy.mode(), SessionMode::Unspecified);
        assert!(legacy.metadata.is_empty());
    }
}
