"""The committed stubs (`src/phrony/gen/`) are what `proto/` generates today."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import phrony
from phrony.gen.phrony.runtime.v1 import runtime_pb2

SDK_ROOT = Path(__file__).resolve().parents[1]
GEN_STUBS = SDK_ROOT / "tools" / "gen_stubs.py"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_stubs", GEN_STUBS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_stubs"] = module
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_the_proto(tmp_path):
    gen = load_generator()
    fresh = tmp_path / "gen"
    gen.generate(fresh)
    found = gen.differences(gen.GEN_DIR, fresh)
    assert found == [], (
        "sdks/python/src/phrony/gen is stale; run `python sdks/python/tools/gen_stubs.py`:\n" + "\n".join(found)
    )


def test_the_installed_package_carries_the_same_runtime_descriptor():
    # The installed SDK (not the source tree) is what users get: its descriptor is proto/'s.
    committed = (SDK_ROOT / "src" / "phrony" / "gen" / "phrony" / "runtime" / "v1" / "runtime_pb2.py").read_text()
    installed = Path(runtime_pb2.__file__).read_text()
    assert installed == committed, f"installed {phrony.__file__} is not this source tree; rerun .ci/python-sdk-venv.sh"
