"""Tool descriptor pins, computed exactly as the runtime computes them.

A pin is ``sha256:`` + the hex SHA-256 of the canonical JSON of
``{"description", "input_schema", "name", "version"}`` taken from a Tool document
(``tools/*.yaml``): ``name`` is the dispatch ref ``metadata.namespace + "." + metadata.name``,
``version`` is ``metadata.version`` (``default`` when it is empty), ``description`` is
``spec.description`` and ``input_schema`` is the resolved ``spec.input_schema`` (its ``inline``
value, or the JSON file its ``ref`` names, relative to the parent of the file's ``tools/``
directory, else to the file's own directory), ``null`` when the tool has none. This is what
``phrony tools pin FILE`` prints and what the runtime publishes for an agent version; a worker
registering a non-empty ``descriptor_hash`` that matches no published pin is refused.

Canonical JSON (the runtime's ``canonical.rs``): compact, object keys sorted, ``<``, ``>``,
``&``, U+2028 and U+2029 escaped as ``\\u003c``-style sequences, other control characters as
JSON escapes, non-ASCII text as UTF-8, integral numbers written as integers and other floats
like Go's ``encoding/json`` (``0.5``, ``1e+21``, ``1.5e-7``).

The YAML is read as YAML 1.2 (the runtime's parser): ``yes``/``no``/``on``/``off`` are strings,
``1e3`` is a number. Plain scalars whose reading differs between YAML versions or parsers
(``0777``, ``1_000``, ``0b101``, ``1:30``) and aliases (which the runtime refuses) are rejected
with a ``ValueError``: quote them. The runtime validates more than this module does (JSON Schema
validity, field formats): ``phrony tools pin FILE`` is the reference, and a file it refuses has no
pin.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

__all__ = ["PIN_PREFIX", "canonical_json", "descriptor_pin", "descriptor_pin_of", "tool_pin_of"]

PIN_PREFIX = "sha256:"
API_VERSION = "phrony.com/v1"
# Largest Tool document or schema file read (the runtime's MAX_YAML_BYTES, 8 MiB).
MAX_FILE_BYTES = 8 << 20

_U64_END = 1 << 64
_I64_MIN = -(1 << 63)


# --- canonical JSON ----------------------------------------------------------------------


def _go_float(v: float) -> str:
    """A float as Go's encoding/json (and the runtime's ``go_float``) writes it."""
    if v == 0.0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    digits = Decimal(repr(v))  # shortest round-trip digits, like Rust
    if 1e-6 <= abs(v) < 1e21:
        text = format(digits, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    # Exponent form: shortest mantissa, `e+21` / `e-7` (at least two digits after `e+`).
    sign, coeff, exponent = digits.normalize().as_tuple()
    coeff_s = "".join(map(str, coeff))
    mant = coeff_s[0] + ("." + coeff_s[1:] if len(coeff_s) > 1 else "")
    e = exponent + len(coeff_s) - 1
    prefix = "-" if sign else ""
    if e < 0:
        return f"{prefix}{mant}e-{-e}"
    return f"{prefix}{mant}e+{e:02d}"


def _normalize(v: Any, where: str) -> Any:
    """The runtime's canonical shape: integral floats that fit an integer become integers."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        if not (_I64_MIN <= v < _U64_END):
            raise ValueError(f"{where}: integer {v} is out of the 64-bit range")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{where}: {v} is not a JSON number")
        if v == int(v) and (0.0 <= v < float(_U64_END) or float(_I64_MIN) <= v < 0.0):
            return int(v)
        return v
    if isinstance(v, list):
        return [_normalize(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: mapping key {k!r} is not a string; quote it")
            out[k] = _normalize(x, f"{where}.{k}")
        return out
    raise ValueError(f"{where}: unsupported value {v!r} ({type(v).__name__})")


_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


def canonical_json(value: Any) -> bytes:
    """The runtime's canonical JSON bytes of a JSON-like value (sorted keys, Go escaping)."""
    text = "".join(_iterencode(_normalize(value, "value")))
    # `<`, `>`, `&`, U+2028, U+2029 only occur inside strings (keys or values) of the output.
    text = _GO_ESCAPE_RE.sub(lambda m: _GO_ESCAPES[m.group(0)], text)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text is not valid Unicode (lone surrogate): {e}") from None


def _iterencode(value: Any) -> Any:
    """json's pure-Python encoder (compact, sorted keys, no ASCII escaping) with Go floats."""
    from json.encoder import _make_iterencode  # type: ignore[attr-defined]

    def floatstr(o: float) -> str:
        return _go_float(float(o))

    def default(o: Any) -> Any:
        raise TypeError(f"{type(o).__name__} is not JSON")

    return _make_iterencode(
        None,
        default,
        json.encoder.py_encode_basestring,
        None,
        floatstr,
        ":",
        ",",
        True,  # sort_keys
        False,  # skipkeys
        True,  # _one_shot
    )(value, 0)


def descriptor_pin(name: str, version: str, description: str, input_schema: Any | None) -> str:
    """The pin of a tool descriptor (see the module documentation); an empty version is
    ``default``."""
    schema = None if input_schema is None else _normalize(input_schema, "input_schema")
    doc = {
        "description": description,
        "input_schema": schema,
        "name": name,
        "version": version or "default",
    }
    return PIN_PREFIX + hashlib.sha256(canonical_json(doc)).hexdigest()


# --- YAML 1.2 reading --------------------------------------------------------------------

# YAML 1.2 core schema (what the runtime's parser reads).
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT10 = re.compile(r"^[-+]?[0-9]+$")
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")
# Plain scalars YAML 1.1 or other parsers read as numbers while YAML 1.2 core reads them as
# strings (or reads them differently): refused, so no pin silently differs from the runtime's.
_AMBIGUOUS = re.compile(
    r"^(?:[-+]?0[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"  # leading zero: octal in 1.1
    r"|[-+]?[0-9][0-9_]*_[0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?"  # underscores
    r"|[-+]?0b[0-1_]+|[-+]0o[0-7]+|[-+]0x[0-9a-fA-F]+|0X[0-9a-fA-F]+|0O[0-7]+"
    r"|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?)$"  # sexagesimal
)


class _Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema, no merge keys, no timestamps, no aliases and
    no duplicate keys (the runtime refuses both)."""


_Loader.yaml_implicit_resolvers = {}  # resolution is done in construct_scalar below


def _compose_node(self: _Loader, parent: Any, index: Any) -> Any:
    if self.check_event(yaml.AliasEvent):
        event = self.peek_event()
        mark = event.start_mark
        raise ValueError(
            f"line {mark.line + 1} column {mark.column + 1}: aliases (*{event.anchor}) are not allowed"
        )
    return yaml.SafeLoader.compose_node(self, parent, index)


_Loader.compose_node = _compose_node  # type: ignore[method-assign]


class _Plain:
    """A plain (unquoted) scalar as written: string fields of a document take its text as is
    (the runtime's parser does, so `version: 1.10` is "1.10"), JSON values its YAML 1.2 core
    reading (:func:`_typed`)."""

    __slots__ = ("line", "column", "text")

    def __init__(self, text: str, line: int, column: int) -> None:
        self.text = text
        self.line = line
        self.column = column

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Plain) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return repr(self.text)

    def is_null(self) -> bool:
        return bool(_NULL.match(self.text))

    def typed(self) -> Any:
        text = self.text
        if _NULL.match(text):
            return None
        if _BOOL.match(text):
            return text.lower() == "true"
        ambiguous = _AMBIGUOUS.match(text)
        if _INT10.match(text) and not ambiguous:
            return int(text, 10)
        if _INT8.match(text):
            return int(text[2:], 8)
        if _INT16.match(text):
            return int(text[2:], 16)
        if _FLOAT.match(text) and not ambiguous:
            return float(text)
        if _INF.match(text) or _NAN.match(text):
            return float(text.replace(".", "").lower().replace("+", ""))
        if ambiguous:
            raise ValueError(
                f"line {self.line} column {self.column}: the plain scalar {text!r} reads "
                "differently across YAML versions; quote it"
            )
        return text


def _construct_plain(loader: _Loader, node: yaml.ScalarNode) -> Any:
    if node.style is not None:  # quoted or block scalar: always a string
        return node.value
    return _Plain(node.value, node.start_mark.line + 1, node.start_mark.column + 1)


def _typed(v: Any) -> Any:
    """A loaded value with its plain scalars read by the YAML 1.2 core schema."""
    if isinstance(v, _Plain):
        return v.typed()
    if isinstance(v, list):
        return [_typed(x) for x in v]
    if isinstance(v, dict):
        # A key is read as a string, as written (the runtime's parser does: `1:` is "1").
        return {(k.text if isinstance(k, _Plain) else k): _typed(x) for k, x in v.items()}
    return v


def _null(v: Any) -> bool:
    return v is None or (isinstance(v, _Plain) and v.is_null())


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    seen: set[str] = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, (str, _Plain)):
            mark = key_node.start_mark
            raise ValueError(f"line {mark.line + 1} column {mark.column + 1}: a mapping key must be a scalar")
        text = key.text if isinstance(key, _Plain) else key
        if text in seen:
            mark = key_node.start_mark
            raise ValueError(f"line {mark.line + 1} column {mark.column + 1}: duplicate key {text!r}")
        seen.add(text)
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> list[Any]:
    return [loader.construct_object(child, deep=True) for child in node.value]


# Plain scalars resolve to the str tag (no implicit resolvers); type them by YAML 1.2 core.
_Loader.add_constructor("tag:yaml.org,2002:str", _construct_plain)
_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def _read_limited(path: Path, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: {what} is larger than {MAX_FILE_BYTES >> 20} MiB")
    return data


def _load_yaml(path: Path) -> Any:
    data = _read_limited(path, "Tool document")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: file is not valid UTF-8") from None
    if not text.strip():
        raise ValueError(f"{path}: the document is empty")
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader (SafeLoader subclass)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from None


# --- Tool documents ----------------------------------------------------------------------


def _string(path: Path, field: str, value: Any) -> str:
    """A string field as the runtime reads it: a plain scalar's text as written, null as ""."""
    if _null(value):
        return ""
    if isinstance(value, _Plain):
        return value.text
    if not isinstance(value, str):
        raise ValueError(f"{path}: {field} must be a string, got {type(value).__name__}")
    return value


def _mapping(path: Path, field: str, value: Any) -> dict[str, Any]:
    """A mapping field with plain-scalar keys as their text; null is empty."""
    if _null(value):
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{path}: {field} must be a mapping")
    return {(k.text if isinstance(k, _Plain) else k): v for k, v in value.items()}


def _tool_root(path: Path) -> Path:
    parent = path.parent
    if parent.name == "tools" and parent.parent != parent:
        return parent.parent
    return parent


def _safe_relative(reference: str, path: Path, field: str) -> PurePosixPath:
    if not reference.strip():
        raise ValueError(f"{path}: {field}: ref is required")
    if reference.startswith(("/", "\\")) or os.path.isabs(reference) or re.match(r"^[A-Za-z]:", reference):
        raise ValueError(f"{path}: {field}: ref must be bundle-relative")
    parts: list[str] = []
    for part in PurePosixPath(reference).parts:
        if part == ".":
            continue
        if part == "..":
            if not parts:
                raise ValueError(f"{path}: {field}: ref path escapes bundle directory")
            parts.pop()
        else:
            parts.append(part)
    if not parts:
        raise ValueError(f"{path}: {field}: ref path escapes bundle directory")
    return PurePosixPath(*parts)


def _version_label(path: Path, field: str, v: Any) -> str | None:
    if _null(v):
        return None
    try:
        v = _typed(v)
    except ValueError as e:
        raise ValueError(f"{path}: {field}: {e}") from None
    if isinstance(v, bool):
        raise ValueError(f"{path}: {field} must be a string or a number")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float(float(int(v))) if v == int(v) else _go_float(v)
    if isinstance(v, str):
        return v
    raise ValueError(f"{path}: {field} must be a string or a number")


def _schema_file(path: Path, reference: str, version: str | None, field: str) -> Path:
    rel = _safe_relative(reference, path, field)
    name = rel.name
    stem_rel = str(rel)
    suffix = PurePosixPath(name).suffix
    if suffix:
        stem, exts = stem_rel[: -len(suffix)], [suffix]
    else:
        stem, exts = stem_rel, [".json"]
    if version is not None:
        if "/" in version or "\\" in version or version in ("..", "."):
            raise ValueError(f"{path}: {field}: ref path escapes bundle directory")
        patterns = [f"{stem}-{version}", f"{stem}/{version}", f"{stem}/v{version}"]
    else:
        patterns = [stem]
    root = _tool_root(path)
    for pattern in patterns:
        for ext in exts:
            full = root / f"{pattern}{ext}"
            if full.is_file():
                return full
    note = f" (version {version!r})" if version is not None else ""
    raise ValueError(f"{path}: {field}: ref {reference!r}{note} not found in bundle directory {root.resolve()}")


def _resolve_schema(path: Path, schema: Any, field: str) -> Any | None:
    if _null(schema):
        return None
    schema = _mapping(path, field, schema)
    reference = _string(path, f"{field}.ref", schema.get("ref"))
    inline = schema.get("inline")
    has_inline = not (_null(inline) or (isinstance(inline, dict) and not inline))
    if has_inline:
        if reference.strip():
            raise ValueError(f"{path}: {field}: set exactly one of ref or inline, not both")
        try:
            inline = _typed(inline)
        except ValueError as e:
            raise ValueError(f"{path}: {field}.inline: {e}") from None
        if not isinstance(inline, dict):
            raise ValueError(f"{path}: {field}.inline must be a JSON Schema object")
        return _normalize(inline, f"{path}: {field}.inline")
    if not reference.strip():
        raise ValueError(f"{path}: {field}: must set exactly one of ref or inline")
    version = _version_label(path, f"{field}.version", schema.get("version"))
    file = _schema_file(path, reference, version, f"{field}.ref")
    data = _read_limited(file, "schema file")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: {field}.ref: {file}: invalid JSON: {e}") from None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{path}: {field}.ref: {file}: schema must be a non-empty JSON object")
    return _normalize(value, f"{path}: {field}.ref: {file}")


def descriptor_pin_of(path: str | os.PathLike[str]) -> str:
    """The descriptor pin of a Tool document (``tools/*.yaml``): what the runtime publishes for
    the tool and what a worker serving it passes as its ``descriptor_hash``; the same value as
    ``phrony tools pin FILE``.

    Raises ``ValueError`` (naming the file and the field) when the file cannot be read or is
    not a usable Tool document."""
    return tool_pin_of(path)[2]


def tool_pin_of(path: str | os.PathLike[str]) -> tuple[str, str, str]:
    """``(tool, version, pin)`` of a Tool document: its dispatch ref ``namespace.name``, its
    dispatch version (``default`` when it has none) and its descriptor pin (see
    :func:`descriptor_pin_of`)."""
    path = Path(path)
    doc = _load_yaml(path)
    if _null(doc):
        raise ValueError(f"{path}: the document is empty")
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a Tool document must be a YAML mapping")
    doc = _mapping(path, "the document", doc)
    kind = _string(path, "kind", doc.get("kind"))
    if kind != "Tool":
        raise ValueError(f"{path}: kind: expected kind Tool, got {kind!r}")
    api_version = _string(path, "apiVersion", doc.get("apiVersion"))
    if api_version != API_VERSION:
        raise ValueError(f"{path}: apiVersion: expected {API_VERSION!r}, got {api_version!r}")
    metadata = _mapping(path, "metadata", doc.get("metadata"))
    spec = _mapping(path, "spec", doc.get("spec"))
    namespace = _string(path, "metadata.namespace", metadata.get("namespace"))
    name = _string(path, "metadata.name", metadata.get("name"))
    version = _string(path, "metadata.version", metadata.get("version"))
    for field, value in (("metadata.namespace", namespace), ("metadata.name", name)):
        if not value.strip():
            raise ValueError(f"{path}: {field} is required")
    description = _string(path, "spec.description", spec.get("description"))
    schema = _resolve_schema(path, spec.get("input_schema"), "spec.input_schema")
    tool = f"{namespace}.{name}"
    version = version or "default"
    return tool, version, descriptor_pin(tool, version, description, schema)
