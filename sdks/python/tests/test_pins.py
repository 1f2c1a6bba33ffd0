"""`descriptor_pin_of` computes the runtime's tool descriptor pin: for every Tool document of
`policies-examples/` and for crafted ones (unicode, `<>&`, U+2028, control characters, floats,
schema refs, no schema, no version) it equals what `phrony tools pin FILE --output json`
prints. And the SDK refuses, with a ValueError naming the file, what it cannot pin exactly."""

from __future__ import annotations

import json
import subprocess
import textwrap
import warnings
from pathlib import Path

import pytest

from phrony.worker import Worker, descriptor_hash_of, descriptor_pin, descriptor_pin_of, tool_pin_of
from phrony.worker.pins import _go_float, canonical_json

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_TOOLS = sorted(
    p for p in (REPO_ROOT / "policies-examples").rglob("*.yaml") if p.parent.name == "tools"
)


def cli_pin(cli: Path, file: Path) -> dict:
    done = subprocess.run(
        [str(cli), "tools", "pin", str(file), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"phrony tools pin {file}: {done.stderr}"
    [row] = json.loads(done.stdout)
    return row


def tool_yaml(name: str, *, version: str | None = "1.0.0", description: str = "d", schema: str = "") -> str:
    version_line = f"  version: {version}\n" if version is not None else ""
    return (
        "apiVersion: phrony.com/v1\nkind: Tool\nmetadata:\n"
        f"  name: {name}\n  namespace: crafted\n{version_line}"
        f"spec:\n  description: {description}\n  side_effect_class: read_only\n{schema}"
    )


CRAFTED = {
    "unicode": tool_yaml(
        "unicode",
        description='"Résumé ✓ 日本語 😀 <b>&amp;</b> line\\u2028sep\\u2029para \\x01\\x1f\\u007f tab\\t quote\\" back\\\\"',
        schema=textwrap.indent(
            textwrap.dedent(
                """\
                input_schema:
                  inline:
                    type: object
                    description: "<script>&</script> \\u2028 ünïcödé"
                    properties:
                      "ключ<>&": {type: string, description: "Zeilen\\nUmbruch"}
                      amount: {type: number, minimum: 0.5, maximum: 1e3, multipleOf: 0.01}
                      tiny: {type: number, exclusiveMinimum: 1.5e-7, default: 1e-10}
                      huge: {type: number, maximum: 1.5e300, default: 1e21}
                      count: {type: integer, minimum: -3, maximum: 9007199254740993, default: 50.0}
                      flag: {type: string, enum: [yes, no, on, off, y, n, "true"]}
                      1: {type: string}
                      true: {type: string}
                      yes: {type: string}
                      when: {type: string, default: 2024-01-01}
                      nested:
                        type: object
                        properties:
                          deeper:
                            type: array
                            items: {type: object, properties: {z: {type: "null"}, a: {type: boolean, default: true}}}
                    required: [amount, "ключ<>&"]
                """
            ),
            "  ",
        ),
    ),
    "no-schema": tool_yaml("no-schema"),
    "no-version": tool_yaml("no-version", version=None, description="Looks it up."),
    "null-schema": tool_yaml("null-schema", schema="  input_schema: null\n"),
    "schema-ref": tool_yaml("schema-ref", schema="  input_schema:\n    ref: schemas/lookup\n"),
    "schema-ref-versioned": tool_yaml(
        "schema-ref-versioned", schema="  input_schema:\n    ref: schemas/lookup.json\n    version: 2\n"
    ),
    "plain-scalars-as-text": tool_yaml(
        "plain-scalars-as-text", version="1.10", description="0777",
        schema="  input_schema:\n    inline: {type: object, const: 1.10, default: +12, examples: [.5, 0x1F, 0o17, -0.0, 1E3]}\n",
    ),
    "numeric-version": tool_yaml("numeric-version", version="2", description="true"),
    "block-description": tool_yaml(
        "block-description", description="|\n    Two lines & <more>,\n    then the end.\n"
    ),
}

SCHEMA_LOOKUP = {"type": "object", "properties": {"order_id": {"type": "string", "maxLength": 64}}, "required": ["order_id"]}
SCHEMA_LOOKUP_2 = '{"type":"object","properties":{"q":{"type":"number","minimum":0.25,"maximum":1E3}, "n": {"type": "integer", "default": 10.0}}}'


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundle")
    (root / "tools").mkdir()
    (root / "schemas").mkdir()
    (root / "schemas" / "lookup.json").write_text(json.dumps(SCHEMA_LOOKUP, indent=2), encoding="utf-8")
    (root / "schemas" / "lookup-2.json").write_text(SCHEMA_LOOKUP_2, encoding="utf-8")
    files = {}
    for name, text in CRAFTED.items():
        path = root / "tools" / f"crafted.{name}.yaml"
        path.write_text(text, encoding="utf-8")
        files[name] = path
    return files


def test_the_examples_exist():
    assert len(EXAMPLE_TOOLS) >= 10, EXAMPLE_TOOLS


@pytest.mark.parametrize("file", EXAMPLE_TOOLS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_example_tool_has_the_cli_pin(cli_binary, file):
    row = cli_pin(cli_binary, file)
    assert descriptor_pin_of(file) == row["pin"]
    assert tool_pin_of(file) == (row["tool"], row["version"], row["pin"])


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_tools_have_the_cli_pin(cli_binary, crafted, name):
    row = cli_pin(cli_binary, crafted[name])
    assert tool_pin_of(crafted[name]) == (row["tool"], row["version"], row["pin"])


def test_the_crafted_tools_differ(crafted):
    pins = {descriptor_pin_of(p) for p in crafted.values()}
    assert len(pins) == len(crafted)
    assert tool_pin_of(crafted["no-version"])[1] == "default"
    # A null input schema is no schema, like the runtime's.
    no_schema = descriptor_pin("crafted.null-schema", "1.0.0", "d", None)
    assert descriptor_pin_of(crafted["null-schema"]) == no_schema


def test_the_runtime_fixed_pin_and_canonical_bytes():
    # crates/phrony-manifest/src/pin.rs: a_fixed_descriptor_has_a_stable_pin.
    schema = {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["order_id", "amount"],
    }
    pin = descriptor_pin("payments.issue-refund", "1.0.0", "Issue a refund.", schema)
    assert pin == "sha256:d49b527b1979c00c6fc285f1116fc2bb7544033175a663b3a6dafbcc7a3d3a1e"
    assert descriptor_pin("orders.lookup", "", "d", None) == descriptor_pin("orders.lookup", "default", "d", None)
    # canonical.rs: escapes_html_characters_and_line_separators.
    value = {"b": "a<b>&c\u2028\n\"", "a": [1, 2.0, {"z": None, "y": True}]}
    assert canonical_json(value) == rb'{"a":[1,2,{"y":true,"z":null}],"b":"a\u003cb\u003e\u0026c\u2028\n\""}'
    assert canonical_json({"é": "\x01\x7f😀"}) == '{"é":"\\u0001\x7f😀"}'.encode()


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (1000.0, "1000"),
        (250.5, "250.5"),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (0.000001, "0.000001"),
        (1.5e-7, "1.5e-7"),
        (1e-10, "1e-10"),
        (0.0, "0"),
        (-0.0, "-0"),
        (18446744073709551616.0, "18446744073709552000"),
    ],
)
def test_floats_print_like_the_runtime(value, text):
    # crates/phrony-manifest/src/canonical.rs: floats_print_like_go.
    assert _go_float(value) == text


def test_integral_floats_are_integers():
    assert canonical_json([50.0, -3.0, -0.0, 1.5, 18446744073709551616.0]) == b"[50,-3,0,1.5,18446744073709552000]"


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ("      default: 0777\n", "'0777' reads differently"),
        ("      default: 1_000\n", "'1_000' reads differently"),
        ("      default: 0b101\n", "'0b101' reads differently"),
        ("      default: 1:30\n", "'1:30' reads differently"),
        ("      default: &a 1\n      x: *a\n", "aliases (*a) are not allowed"),
        ("      default: 1\n      default: 2\n", "duplicate key 'default'"),
        ("      default: .nan\n", "not a JSON number"),
        ("      [a]: x\n", "a mapping key must be a scalar"),
    ],
)
def test_what_cannot_be_pinned_exactly_is_refused(tmp_path, snippet, message):
    schema = "  input_schema:\n    inline:\n      type: object\n" + snippet
    file = tmp_path / "t.yaml"
    file.write_text(tool_yaml("t", schema=schema), encoding="utf-8")
    with pytest.raises(ValueError, match="t.yaml") as raised:
        descriptor_pin_of(file)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Agent\napiVersion: phrony.com/v1\n", "kind: expected kind Tool"),
        ("kind: Tool\napiVersion: v2\nmetadata: {name: a, namespace: b}\n", "apiVersion"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a}\n", "metadata.namespace is required"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a, namespace: b}\nspec: {description: [x]}\n", "spec.description must be a string"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a, namespace: b}\nspec: {input_schema: {ref: ../x}}\n", "spec.input_schema.ref: ref path escapes"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a, namespace: b}\nspec: {input_schema: {ref: /etc/x}}\n", "must be bundle-relative"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a, namespace: b}\nspec: {input_schema: {ref: missing}}\n", "not found in bundle directory"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a, namespace: b}\nspec: {input_schema: {ref: s, inline: {type: object}}}\n", "exactly one of ref or inline, not both"),
        ("kind: Tool\napiVersion: phrony.com/v1\nmetadata: {name: a, namespace: b}\nspec: {input_schema: {inline: {}}}\n", "spec.input_schema: must set exactly one of ref or inline"),
        ("kind: [unclosed\n", "invalid YAML"),
        ("- a list\n", "must be a YAML mapping"),
    ],
)
def test_malformed_tool_documents_name_the_file_and_field(tmp_path, text, message):
    file = tmp_path / "bad.yaml"
    file.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="bad.yaml") as raised:
        descriptor_pin_of(file)
    assert message in str(raised.value)


def test_a_missing_or_oversized_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="nope.yaml: cannot read Tool document"):
        descriptor_pin_of(tmp_path / "nope.yaml")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * ((8 << 20) + 1))
    with pytest.raises(ValueError, match="larger than 8 MiB"):
        descriptor_pin_of(big)


def test_the_deprecated_alias_returns_the_pin_and_warns():
    file = EXAMPLE_TOOLS[0]
    with pytest.warns(DeprecationWarning, match="descriptor_pin_of"):
        assert descriptor_hash_of(file) == descriptor_pin_of(file)


def test_register_tool_refuses_a_descriptor_of_another_tool():
    file = REPO_ROOT / "policies-examples" / "refund-agent" / "tools" / "payments.issue-refund.yaml"
    worker = Worker(worker_id="w", runtime_addr="127.0.0.1:1", handle_signals=False)
    with pytest.raises(ValueError, match="describes payments.issue-refund@1.0.0, not orders.lookup-order@1.0.0"):
        worker.register_tool(tool="orders.lookup-order", version="1.0.0", handler=lambda a, c: {}, descriptor=file)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        worker.register_tool(tool="payments.issue-refund", version="1.0.0", handler=lambda a, c: {}, descriptor=file)
