"""Compile our .proto files and compare descriptors for wire compatibility.

`compile_proto` turns a proto source tree into live descriptors (with
`grpc_tools.protoc`, in a private descriptor pool so that several compilations
never clash). `wire_differences` lists every way a candidate file breaks a
reference file for clients generated from the reference; additions (new
messages, fields, enum values, methods) are allowed.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
    ServiceDescriptor,
)
from grpc_tools import protoc

RUNTIME_PROTO = "phrony/runtime/v1/runtime.proto"

_TYPE_NAMES = {
    value: name[len("TYPE_") :].lower()
    for name, value in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def compile_descriptor_set(
    proto_root: Path, file: str = RUNTIME_PROTO, *, source_info: bool = False
) -> descriptor_pb2.FileDescriptorSet:
    """Compiles `file` under `proto_root` into a descriptor set with its imports.

    With `source_info`, the set also carries comments and source locations.
    Raises `RuntimeError` with protoc's exit status when compilation fails
    (protoc prints its diagnostics to stderr).
    """
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "descriptor_set.pb"
        args = [
            "grpc_tools.protoc",
            f"--proto_path={proto_root}",
            f"--proto_path={well_known}",
            f"--descriptor_set_out={out}",
            "--include_imports",
        ]
        if source_info:
            args.append("--include_source_info")
        status = protoc.main([*args, file])
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status} compiling {file} under {proto_root}")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def compile_proto(proto_root: Path, file: str = RUNTIME_PROTO) -> FileDescriptor:
    """Compiles `file` under `proto_root` and returns its live descriptor."""
    pool = descriptor_pool.DescriptorPool()
    # --include_imports writes files in dependency order.
    for file_proto in compile_descriptor_set(proto_root, file).file:
        pool.Add(file_proto)
    return pool.FindFileByName(file)


def _label(field: FieldDescriptor) -> str:
    if field.is_repeated:
        return "repeated"
    if field.is_required:
        return "required"
    return "optional"


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return field.message_type.full_name
    if field.enum_type is not None:
        return field.enum_type.full_name
    return ""


def _field_shape(field: FieldDescriptor) -> dict[str, object]:
    """Everything about a field that a generated client depends on."""
    oneof = field.containing_oneof
    return {
        "number": field.number,
        "type": _TYPE_NAMES.get(field.type, field.type),
        "label": _label(field),
        "type_name": _type_name(field),
        "oneof": oneof.name if oneof is not None else "",
        "json_name": field.json_name,
        "has_presence": field.has_presence,
        "packed": field.is_packed,
    }


def _reserved(message: Descriptor) -> tuple[set[int], set[str]]:
    proto = descriptor_pb2.DescriptorProto()
    message.CopyToProto(proto)
    numbers = {n for r in proto.reserved_range for n in range(r.start, r.end)}
    return numbers, set(proto.reserved_name)


def _compare_enum(ref: EnumDescriptor, ours: EnumDescriptor | None, out: list[str]) -> None:
    if ours is None:
        out.append(f"enum {ref.full_name}: missing")
        return
    for value in ref.values:
        mine = ours.values_by_name.get(value.name)
        if mine is None:
            out.append(f"enum value {ref.full_name}.{value.name}: missing")
        elif mine.number != value.number:
            out.append(f"enum value {ref.full_name}.{value.name}: number {mine.number}, expected {value.number}")


def _compare_message(ref: Descriptor, ours: Descriptor | None, out: list[str]) -> None:
    if ours is None:
        out.append(f"message {ref.full_name}: missing")
        return
    if ref.GetOptions().map_entry != ours.GetOptions().map_entry:
        out.append(f"message {ref.full_name}: map_entry differs")
    for field in ref.fields:
        where = f"field {ref.full_name}.{field.name}"
        mine = ours.fields_by_name.get(field.name)
        if mine is None:
            out.append(f"{where}: missing")
            continue
        expected, actual = _field_shape(field), _field_shape(mine)
        for key, value in expected.items():
            if actual[key] != value:
                out.append(f"{where}: {key} is {actual[key]!r}, expected {value!r}")
    for oneof in ref.oneofs:
        mine_oneof = ours.oneofs_by_name.get(oneof.name)
        if mine_oneof is None:
            out.append(f"oneof {ref.full_name}.{oneof.name}: missing")
            continue
        missing = {f.name for f in oneof.fields} - {f.name for f in mine_oneof.fields}
        if missing:
            out.append(f"oneof {ref.full_name}.{oneof.name}: lacks {sorted(missing)}")
    # Numbers and names the reference reserved must stay unused (and reserved),
    # otherwise an old client could misread a new field.
    ref_numbers, ref_names = _reserved(ref)
    our_numbers, our_names = _reserved(ours)
    for number in sorted(ref_numbers - our_numbers):
        out.append(f"message {ref.full_name}: reserved number {number} is not reserved")
    for name in sorted(ref_names - our_names):
        out.append(f"message {ref.full_name}: reserved name {name!r} is not reserved")
    for nested in ref.nested_types:
        _compare_message(nested, ours.nested_types_by_name.get(nested.name), out)
    for enum in ref.enum_types:
        _compare_enum(enum, ours.enum_types_by_name.get(enum.name), out)


def _compare_service(ref: ServiceDescriptor, ours: ServiceDescriptor | None, out: list[str]) -> None:
    if ours is None:
        out.append(f"service {ref.full_name}: missing")
        return
    for method in ref.methods:
        where = f"rpc {ref.full_name}.{method.name}"
        mine = ours.methods_by_name.get(method.name)
        if mine is None:
            out.append(f"{where}: missing")
            continue
        for attr in ("client_streaming", "server_streaming"):
            if getattr(mine, attr) != getattr(method, attr):
                out.append(f"{where}: {attr} is {getattr(mine, attr)}, expected {getattr(method, attr)}")
        for attr in ("input_type", "output_type"):
            expected, actual = getattr(method, attr).full_name, getattr(mine, attr).full_name
            if actual != expected:
                out.append(f"{where}: {attr} is {actual}, expected {expected}")


def wire_differences(reference: FileDescriptor, candidate: FileDescriptor) -> list[str]:
    """Returns every incompatibility of `candidate` with `reference` (empty: compatible)."""
    out: list[str] = []
    if candidate.name != reference.name:
        out.append(f"file name is {candidate.name!r}, expected {reference.name!r}")
    if candidate.package != reference.package:
        out.append(f"package is {candidate.package!r}, expected {reference.package!r}")
    ref_syntax = _syntax(reference)
    if _syntax(candidate) != ref_syntax:
        out.append(f"syntax is {_syntax(candidate)!r}, expected {ref_syntax!r}")
    ours_deps = {d.name for d in candidate.dependencies}
    for dep in reference.dependencies:
        if dep.name not in ours_deps:
            out.append(f"import {dep.name!r}: missing")
    for message in reference.message_types_by_name.values():
        _compare_message(message, candidate.message_types_by_name.get(message.name), out)
    for enum in reference.enum_types_by_name.values():
        _compare_enum(enum, candidate.enum_types_by_name.get(enum.name), out)
    for service in reference.services_by_name.values():
        _compare_service(service, candidate.services_by_name.get(service.name), out)
    return out


def _syntax(file: FileDescriptor) -> str:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto.syntax or "proto2"
