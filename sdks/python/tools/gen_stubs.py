"""Generates the SDK's gRPC stubs (`src/phrony/gen/`) from the repository's `.proto` files.

    python sdks/python/tools/gen_stubs.py            # rewrite src/phrony/gen/
    python sdks/python/tools/gen_stubs.py --check    # exit 1 when the committed stubs differ

The stubs are committed so that `pip install ./sdks/python` needs no code generator;
`tests/test_stubs.py` regenerates them into a temporary directory and fails on any difference.
Needs `grpcio-tools` (pinned in `sdks/python/requirements-dev.txt`: its version decides the
generated text).

protoc writes imports relative to the proto root (`from phrony.runtime.v1 import runtime_pb2`);
they are rewritten to the package's `phrony.gen.` prefix, where the 0.1.0 SDK also had them.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

SDK_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = SDK_ROOT.parents[1]
GEN_DIR = SDK_ROOT / "src" / "phrony" / "gen"

# (proto root, file inside it): the runtime API and the standard health service it serves.
PROTOS = [
    (REPO_ROOT / "proto", "phrony/runtime/v1/runtime.proto"),
    (REPO_ROOT / "crates" / "phrony-grpc" / "proto", "grpc/health/v1/health.proto"),
]
# Import prefixes protoc writes, and what they become inside the package.
REWRITES = [
    ("from phrony.runtime.v1 import", "from phrony.gen.phrony.runtime.v1 import"),
    ("from grpc.health.v1 import", "from phrony.gen.grpc.health.v1 import"),
]


def generate(out: Path) -> None:
    """Writes the stubs (with `__init__.py` files) under `out`, which must be empty or absent."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    for root, name in PROTOS:
        args = [
            "protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(root / name),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {root / name}")
    for path in sorted(out.rglob("*.py*")):
        text = path.read_text(encoding="utf-8")
        for before, after in REWRITES:
            text = text.replace(before, after)
        path.write_text(text, encoding="utf-8")
    for directory in [out, *sorted(p for p in out.rglob("*") if p.is_dir())]:
        init = directory / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")


def differences(committed: Path, fresh: Path) -> list[str]:
    """Relative paths that are missing, extra or different between two stub trees."""

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}

    ours, theirs = files(committed), files(fresh)
    found = [f"missing: {p}" for p in sorted(theirs - ours)]
    found += [f"not generated: {p}" for p in sorted(ours - theirs)]
    found += [
        f"differs: {p}"
        for p in sorted(ours & theirs)
        if not filecmp.cmp(committed / p, fresh / p, shallow=False)
    ]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "gen"
        generate(fresh)
        if args.check:
            found = differences(GEN_DIR, fresh)
            for line in found:
                print(line, file=sys.stderr)
            return 1 if found else 0
        if GEN_DIR.exists():
            shutil.rmtree(GEN_DIR)
        shutil.copytree(fresh, GEN_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
