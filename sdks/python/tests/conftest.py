"""Fixtures of the SDK's own tests (run from ./.venv-sdk, where `phrony` is this SDK, 0.2.0).

The daemon, the CLI, the fake OpenAI server and the refund tutorial's world are those of the
published SDK's contract tests (`tests/python/`), imported from there.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SDK_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = SDK_ROOT.parents[1]
CONTRACT_TESTS = REPO_ROOT / "tests" / "python"
sys.path.insert(0, str(CONTRACT_TESTS))

# The seed's backend code connects to the daemon's default address as written
# (`Client(runtime_addr="127.0.0.1:7777")` in app/approvals.py), so its daemon listens there.
SEED_ADDRESS_PORT = 7777


def pytest_configure(config: pytest.Config) -> None:
    import phrony

    if phrony.SDK_VERSION != "0.2.0":
        raise pytest.UsageError(
            f"sdks/python/tests need this SDK (0.2.0), but `phrony` here is {phrony.SDK_VERSION} "
            f"from {phrony.__file__}: run them with .venv-sdk (bash .ci/python-sdk-venv.sh)"
        )


@pytest.fixture(scope="session")
def runtime_binary() -> Path:
    from runtime_daemon import build_runtime

    return build_runtime(REPO_ROOT)


@pytest.fixture(scope="session")
def cli_binary() -> Path:
    from runtime_daemon import build_cli

    return build_cli(REPO_ROOT)


@pytest.fixture(scope="module")
def seed_world(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The tutorial's world (daemon + fake OpenAI + the tutorial's `worker.py`, here on this
    SDK) with the daemon on 127.0.0.1:7777."""
    import socket

    import runtime_daemon
    from tutorial_env import Tutorial

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Like the daemon's listener: a port in TIME_WAIT from an earlier run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", SEED_ADDRESS_PORT))
        except OSError as error:
            pytest.fail(f"the seed's code needs 127.0.0.1:{SEED_ADDRESS_PORT}, which is in use: {error}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime_daemon, "free_port", lambda: SEED_ADDRESS_PORT)
        with Tutorial.started(runtime_binary, cli_binary, tmp_path_factory.mktemp("seed")) as world:
            patch.undo()
            yield world
            assert world.fake.problems == [], world.fake.problems
