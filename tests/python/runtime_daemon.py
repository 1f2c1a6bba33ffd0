"""Build and run the real `phrony-runtime` daemon for contract tests.

The binary comes from `PHRONY_RUNTIME_BIN` if set, else from `cargo build -p runtime` in the
repository (honouring `CARGO_TARGET_DIR`, default `target/`); the `phrony` CLI likewise from
`PHRONY_CLI_BIN` or `cargo build -p cli`. Each daemon listens on a free
port of 127.0.0.1 with its own SQLite database and data directory, and is stopped with SIGTERM
(a clean stop must exit 0).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc

from phrony.gen.grpc.health.v1 import health_pb2, health_pb2_grpc

# How long a daemon may take to become healthy or to stop.
PATIENCE_SECONDS = 30.0


def build_runtime(repo_root: Path) -> Path:
    """Path of a freshly built `phrony-runtime` (or `PHRONY_RUNTIME_BIN`)."""
    return _build(repo_root, "runtime", "phrony-runtime", "PHRONY_RUNTIME_BIN")


def build_cli(repo_root: Path) -> Path:
    """Path of a freshly built `phrony` CLI (or `PHRONY_CLI_BIN`)."""
    return _build(repo_root, "cli", "phrony", "PHRONY_CLI_BIN")


def _build(repo_root: Path, package: str, binary_name: str, override: str) -> Path:
    """`cargo build -p PACKAGE --bin BINARY` in the repository, unless the environment variable
    `override` names a binary to use instead."""
    explicit = os.environ.get(override)
    if explicit:
        binary = Path(explicit)
        if not binary.is_file():
            raise FileNotFoundError(f"{override}={explicit} is not a file")
        return binary
    build = subprocess.run(
        ["cargo", "build", "-p", package, "--bin", binary_name],
        cwd=repo_root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        raise RuntimeError(f"cargo build -p {package} failed:\n{build.stdout}")
    target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
    if not target.is_absolute():
        target = repo_root / target
    binary = target / "debug" / binary_name
    if not binary.is_file():
        raise FileNotFoundError(f"cargo build succeeded but {binary} does not exist")
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RuntimeDaemon:
    """One `phrony-runtime serve` process; use as a context manager."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """`credentials`: how the readiness probe connects to a daemon serving TLS."""
        self.binary = binary
        self.credentials = credentials
        self.workdir = workdir
        self.address = f"127.0.0.1:{free_port()}"
        self.database = workdir / "ledger.db"
        self.log_path = workdir / "runtime.log"
        self.extra_env = extra_env or {}
        self.process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> RuntimeDaemon:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RUNTIME_") and k not in {"RUST_LOG", "PHRONY_ACTOR"}
        }
        env.update(
            {
                "RUNTIME_GRPC_ADDR": self.address,
                "RUNTIME_DATABASE_URL": f"sqlite://{self.database}",
                "XDG_DATA_HOME": str(self.workdir / "xdg"),
                "NO_COLOR": "1",
            }
        )
        env.update(self.extra_env)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(self.binary), "serve"],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        self._wait_until_serving()
        return self

    def _wait_until_serving(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + PATIENCE_SECONDS
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"phrony-runtime exited with {self.process.returncode} before serving:\n{self.log()}"
                )
            # A fresh channel per attempt: a channel that failed to connect waits out grpc's
            # reconnect backoff (about a second) before trying again.
            channel = (
                grpc.secure_channel(self.address, self.credentials)
                if self.credentials is not None
                else grpc.insecure_channel(self.address)
            )
            with channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"phrony-runtime at {self.address} never became SERVING:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM, then wait; returns the exit code (killing the process if it hangs)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=PATIENCE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise TimeoutError(f"phrony-runtime ignored SIGTERM:\n{self.log()}") from None

    def __enter__(self) -> RuntimeDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        code = self.stop()
        if code != 0 and exc[0] is None:
            raise AssertionError(f"phrony-runtime exited with {code} after SIGTERM:\n{self.log()}")
