"""Our proto/ must stay wire-compatible with the published Python SDK (phrony 0.1.0).

The SDK's generated `runtime_pb2.py` embeds the descriptor of the runtime.proto
it was built from; that descriptor is the contract. Our own proto may add
messages, fields, enum values and methods, but everything the SDK knows must be
identical on the wire.
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from proto_compat import RUNTIME_PROTO, compile_descriptor_set, compile_proto, wire_differences

ADDITION_MARKER = "phrony-rs addition"

# The 29 RPCs of phrony.runtime.v1.Runtime as published.
PUBLISHED_RPCS = {
    "GetVersion", "RunSession", "RunSessionInteractive", "Publish", "PublishBundle", "Deploy",
    "DeployBundle", "Rollback", "GetActiveVersion", "GetActiveBundle", "GetBundleSecretRequirements",
    "ListBundles", "ListBundleVersions", "ListBundleDeployments", "ListDeployments", "GetAgentVersion",
    "RetireAgentVersion", "CancelSession", "CompleteSession", "ListAgents", "ListAgentVersions",
    "ListSessions", "InspectSession", "GetApproval", "ListApprovals", "DecideApproval",
    "DeprecateAgentVersion", "ArchiveAgent", "Work",
}  # fmt: skip


def test_reference_is_the_published_sdk(sdk_runtime_descriptor):
    assert metadata.version("phrony") == "0.1.0"
    assert sdk_runtime_descriptor.name == RUNTIME_PROTO
    service = sdk_runtime_descriptor.services_by_name["Runtime"]
    assert {m.name for m in service.methods} == PUBLISHED_RPCS


def test_our_proto_is_wire_compatible_with_the_sdk(sdk_runtime_descriptor, our_runtime_descriptor):
    differences = wire_differences(sdk_runtime_descriptor, our_runtime_descriptor)
    assert differences == [], "proto/ is not wire-compatible with phrony 0.1.0:\n" + "\n".join(differences)


def test_sdk_is_compatible_with_itself(sdk_runtime_descriptor):
    # Guards the comparator against false positives (e.g. map entries, oneofs).
    assert wire_differences(sdk_runtime_descriptor, sdk_runtime_descriptor) == []


def _leading_comments(proto: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    return {tuple(loc.path): loc.leading_comments for loc in proto.source_code_info.location}


def _additions(sdk, ours: descriptor_pb2.FileDescriptorProto) -> list[tuple[str, tuple[int, ...]]]:
    """Every element of `ours` that the SDK does not have, with its source path."""
    found: list[tuple[str, tuple[int, ...]]] = []
    for i, message in enumerate(ours.message_type):
        known = sdk.message_types_by_name.get(message.name)
        if known is None:
            found.append((f"message {message.name}", (4, i)))
            continue
        for j, field in enumerate(message.field):
            if field.name not in known.fields_by_name:
                found.append((f"field {message.name}.{field.name}", (4, i, 2, j)))
    for i, enum in enumerate(ours.enum_type):
        known = sdk.enum_types_by_name.get(enum.name)
        if known is None:
            found.append((f"enum {enum.name}", (5, i)))
            continue
        for j, value in enumerate(enum.value):
            if value.name not in known.values_by_name:
                found.append((f"enum value {enum.name}.{value.name}", (5, i, 2, j)))
    for i, service in enumerate(ours.service):
        known = sdk.services_by_name.get(service.name)
        for j, method in enumerate(service.method):
            if known is None or method.name not in known.methods_by_name:
                found.append((f"rpc {service.name}.{method.name}", (6, i, 2, j)))
    return found


def test_every_addition_is_marked_in_the_proto(proto_root, sdk_runtime_descriptor):
    descriptor_set = compile_descriptor_set(proto_root, source_info=True)
    (ours,) = [f for f in descriptor_set.file if f.name == RUNTIME_PROTO]
    comments = _leading_comments(ours)
    additions = _additions(sdk_runtime_descriptor, ours)
    assert additions, "expected the documented phrony-rs additions to be present"
    unmarked = [what for what, path in additions if ADDITION_MARKER not in comments.get(path, "")]
    assert unmarked == [], f"additions without a '{ADDITION_MARKER}' comment: {unmarked}"


# Each mutation breaks the wire contract in one way; the comparator must say so.
MUTATIONS = [
    pytest.param(
        "string schema_version = 2;",
        "string schema_version = 3;",
        "field phrony.runtime.v1.GetVersionResponse.schema_version: number is 3, expected 2",
        id="field-number",
    ),
    pytest.param(
        "int32 input_tokens = 1;",
        "int64 input_tokens = 1;",
        "field phrony.runtime.v1.TokenUsage.input_tokens: type is 'int64', expected 'int32'",
        id="scalar-type",
    ),
    pytest.param(
        "google.protobuf.Value payload = 3;",
        "bytes payload = 3;",
        "field phrony.runtime.v1.SessionEventEntry.payload: type is 'bytes', expected 'message'",
        id="value-vs-bytes",
    ),
    pytest.param(
        "repeated string classifications = 2;",
        "string classifications = 2;",
        "field phrony.runtime.v1.GovernanceMetadataEvidence.classifications: label is 'optional', expected 'repeated'",
        id="label",
    ),
    pytest.param(
        "message WorkClientMsg {\n  oneof body {",
        "message WorkClientMsg {\n  oneof payload {",
        "field phrony.runtime.v1.WorkClientMsg.nack: oneof is 'payload', expected 'body'",
        id="oneof-membership",
    ),
    pytest.param(
        "empty means the previous deployment.\n  string to_version = 2;",
        "empty means the previous deployment.\n  optional string to_version = 2;",
        "field phrony.runtime.v1.RollbackRequest.to_version: has_presence is True, expected False",
        id="explicit-presence",
    ),
    pytest.param(
        "string delta = 1;",
        'string delta = 1 [json_name = "text"];',
        "field phrony.runtime.v1.RunSessionInteractiveTextDelta.delta: json_name is 'text', expected 'delta'",
        id="json-name",
    ),
    pytest.param(
        "string session_status = 3;",
        "string status_of_session = 3;",
        "field phrony.runtime.v1.DecideApprovalResponse.session_status: missing",
        id="field-renamed",
    ),
    pytest.param(
        "map<string, bytes> resolved_secrets = 3;",
        "map<string, string> resolved_secrets = 3;",
        "field phrony.runtime.v1.RunSessionRequest.ResolvedSecretsEntry.value: type is 'string', expected 'bytes'",
        id="map-value-type",
    ),
    pytest.param(
        "APPROVAL_DECISION_REJECT = 2;",
        "APPROVAL_DECISION_REJECT = 3;",
        "enum value phrony.runtime.v1.ApprovalDecision.APPROVAL_DECISION_REJECT: number 3, expected 2",
        id="enum-value",
    ),
    pytest.param(
        "rpc Work(stream WorkClientMsg)",
        "rpc Work(WorkClientMsg)",
        "rpc phrony.runtime.v1.Runtime.Work: client_streaming is False, expected True",
        id="streaming",
    ),
    pytest.param(
        "rpc GetApproval(GetApprovalRequest) returns (Approval);",
        "rpc GetApproval(GetApprovalRequest) returns (ListApprovalsResponse);",
        "rpc phrony.runtime.v1.Runtime.GetApproval: output_type is phrony.runtime.v1.ListApprovalsResponse, "
        "expected phrony.runtime.v1.Approval",
        id="method-output",
    ),
    pytest.param(
        "reserved 10, 13, 18 to 21;",
        "reserved 10, 18 to 21;",
        "message phrony.runtime.v1.SessionInspect: reserved number 13 is not reserved",
        id="reserved-number",
    ),
    pytest.param(
        "package phrony.runtime.v1;",
        "package phrony.runtime.v2;",
        "package is 'phrony.runtime.v2', expected 'phrony.runtime.v1'",
        id="package",
    ),
]


@pytest.mark.parametrize(("original", "mutated", "expected"), MUTATIONS)
def test_comparator_detects_breaking_change(
    tmp_path, proto_root, sdk_runtime_descriptor, original, mutated, expected
):
    mutated_root = tmp_path / "proto"
    shutil.copytree(proto_root, mutated_root)
    target = mutated_root / RUNTIME_PROTO
    source = target.read_text(encoding="utf-8")
    assert source.count(original) == 1, f"mutation anchor {original!r} must occur exactly once in {RUNTIME_PROTO}"
    target.write_text(source.replace(original, mutated), encoding="utf-8")

    differences = wire_differences(sdk_runtime_descriptor, compile_proto(mutated_root))

    assert expected in differences, "\n".join(differences)
