"""Shared fixtures of the Python contract tests (run from the repository root's .venv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto_compat import compile_proto

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def proto_root() -> Path:
    """The repository's `proto/` source tree."""
    return REPO_ROOT / "proto"


@pytest.fixture(scope="session")
def sdk_runtime_descriptor():
    """`phrony.runtime.v1` as the published `phrony` SDK was generated from it."""
    from phrony.gen.phrony.runtime.v1 import runtime_pb2

    return runtime_pb2.DESCRIPTOR


@pytest.fixture(scope="session")
def our_runtime_descriptor(proto_root: Path):
    """`phrony.runtime.v1` compiled from our `proto/`."""
    return compile_proto(proto_root)


# --- The runtime daemon (test_runtime_sdk.py and later SDK contract tests) -----------------


@pytest.fixture(scope="session")
def runtime_binary() -> Path:
    """The `phrony-runtime` binary, built once per session (or `PHRONY_RUNTIME_BIN`)."""
    from runtime_daemon import build_runtime

    return build_runtime(REPO_ROOT)


@pytest.fixture(scope="module")
def runtime_daemon(runtime_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    """A daemon on a free port with a fresh SQLite database, shared by one test module and
    stopped with SIGTERM (which must exit 0) when the module is done."""
    from runtime_daemon import RuntimeDaemon

    with RuntimeDaemon(runtime_binary, tmp_path_factory.mktemp("runtime")) as daemon:
        yield daemon


# --- The refund tutorial end to end (test_tutorial.py, test_sessions_sdk.py) --------------------


@pytest.fixture(scope="session")
def cli_binary() -> Path:
    """The `phrony` CLI binary, built once per session (or `PHRONY_CLI_BIN`)."""
    from runtime_daemon import build_cli

    return build_cli(REPO_ROOT)


@pytest.fixture(scope="module")
def tutorial(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tutorial's world for one test module: a daemon whose `openai` provider is a scripted
    fake, `support/refund-agent@0.1.0` validated, published and deployed with the CLI, and the
    tutorial's `worker.py` registered (see `tutorial_env.py`)."""
    from tutorial_env import Tutorial

    with Tutorial.started(runtime_binary, cli_binary, tmp_path_factory.mktemp("tutorial")) as world:
        yield world
