"""This SDK is a superset of the published `phrony` 0.1.0's public API: every public name of its
modules exists here, and every callable accepts every parameter 0.1.0's accepts (same kind,
same position, same default), sync stays sync and async stays async.

The published package is unpacked in `.venv-sdk/phrony-0.1.0` (by `.ci/python-sdk-venv.sh`)
and inspected in a subprocess, so both can be named `phrony`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PUBLISHED = Path(sys.prefix) / "phrony-0.1.0"
DUMP = Path(__file__).resolve().parent / "api_dump.py"

# Modules whose public names a 0.1.0 user may import. The 0.1.0 internals that only wire its
# own worker together (`phrony.worker.worker_session`) are not API.
MODULES = [
    "phrony",
    "phrony.agent_ref",
    "phrony.bundle_ref",
    "phrony.types",
    "phrony.phrony",
    "phrony.client",
    "phrony.client.errors",
    "phrony.client.runtime_client",
    "phrony.client.json_bytes",
    "phrony.client.dial",
    "phrony.session",
    "phrony.session.interactive_session",
    "phrony.session.types",
    "phrony.worker",
    "phrony.worker.worker",
    "phrony.worker.work_stream",
    "phrony.worker.types",
    "phrony.gen.phrony.runtime.v1.runtime_pb2",
    "phrony.gen.phrony.runtime.v1.runtime_pb2_grpc",
    "phrony.gen.grpc.health.v1.health_pb2",
    "phrony.gen.grpc.health.v1.health_pb2_grpc",
]


def dump(pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run(
        [sys.executable, str(DUMP), *MODULES], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def apis() -> tuple[dict, dict]:
    if not (PUBLISHED / "phrony" / "__init__.py").is_file():
        pytest.fail(f"the published phrony 0.1.0 is not unpacked at {PUBLISHED}; run .ci/python-sdk-venv.sh")
    theirs = dump(str(PUBLISHED))
    ours = dump(None)
    assert theirs["phrony"]["SDK_VERSION"]["value"] == "'0.1.0'"
    assert ours["phrony"]["SDK_VERSION"]["value"] == "'0.2.0'"
    return theirs, ours


def compatible(theirs: list[dict], ours: list[dict]) -> str | None:
    """Why a call valid for `theirs` parameters may fail with `ours`, or None."""
    by_name = {p["name"]: p for p in ours}
    positional = [p for p in ours if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    for index, p in enumerate(theirs):
        if p["kind"] in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            if not any(q["kind"] == p["kind"] for q in ours):
                return f"no {p['kind']} like 0.1.0's *{p['name']}"
            continue
        q = by_name.get(p["name"])
        if q is None:
            return f"parameter {p['name']!r} is missing"
        if q["kind"] != p["kind"]:
            return f"parameter {p['name']!r} is {q['kind']}, 0.1.0 has {p['kind']}"
        if p["kind"] != "KEYWORD_ONLY" and positional.index(q) != index:
            return f"parameter {p['name']!r} moved from position {index}"
        if p["default"] != q["default"]:
            return f"parameter {p['name']!r} defaults to {q['default']}, 0.1.0 to {p['default']}"
    known = {p["name"] for p in theirs}
    for q in ours:
        if q["name"] not in known and q["default"] is None and q["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            return f"new parameter {q['name']!r} has no default"
    return None


def test_every_public_name_and_signature_of_0_1_0_is_here(apis):
    theirs, ours = apis
    problems = []
    for module, names in theirs.items():
        if module not in ours:
            problems.append(f"{module}: module missing")
            continue
        for name, t in names.items():
            o = ours[module].get(name)
            where = f"{module}.{name}"
            if o is None:
                problems.append(f"{where}: missing")
                continue
            if t["kind"] != o["kind"]:
                problems.append(f"{where}: is a {o['kind']}, 0.1.0 has a {t['kind']}")
                continue
            if t["kind"] == "function":
                if t["async"] != o["async"]:
                    problems.append(f"{where}: async={o['async']}, 0.1.0 async={t['async']}")
                if t["params"] is not None and o["params"] is not None and (why := compatible(t["params"], o["params"])):
                    problems.append(f"{where}: {why}")
            if t["kind"] == "class":
                for member, tm in t["members"].items():
                    om = o["members"].get(member)
                    if om is None:
                        problems.append(f"{where}.{member}: missing")
                        continue
                    if tm["kind"] != om["kind"] or tm["async"] != om["async"]:
                        problems.append(f"{where}.{member}: {om['kind']}/async={om['async']}, 0.1.0 {tm['kind']}/async={tm['async']}")
                    elif tm["params"] is not None and om["params"] is not None and (
                        why := compatible(tm["params"], om["params"])
                    ):
                        problems.append(f"{where}.{member}: {why}")
                for base in t["bases"]:
                    if base not in o["bases"]:
                        problems.append(f"{where}: no longer a subclass of {base}")
            # The SDK's version and the generator's version (of the stubs) differ on purpose.
            if t["kind"] == "value" and t["value"] != o["value"] and name not in ("SDK_VERSION", "GRPC_GENERATED_VERSION"):
                problems.append(f"{where}: is {o['value']}, 0.1.0 has {t['value']}")
    assert problems == [], "\n".join(problems)


def test_the_runtime_messages_and_rpcs_of_0_1_0_are_here(apis):
    theirs, ours = apis
    module = "phrony.gen.phrony.runtime.v1.runtime_pb2"
    assert set(theirs[module]) <= set(ours[module])
    stub = "phrony.gen.phrony.runtime.v1.runtime_pb2_grpc"
    assert set(theirs[stub]["RuntimeStub"]["rpcs"]) <= set(ours[stub]["RuntimeStub"]["rpcs"])
