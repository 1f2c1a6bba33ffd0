"""Helpers of the mock-gate contract tests: start the real binary on a free port, copy the
walkthrough configuration, run the other `mock-gate` commands."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[3]
WALKTHROUGH = REPO_ROOT / "policies-examples" / "regent-walkthrough"
ORG_KEY = "rgnt_ctrl_walkthrough_local"
AGENT_KEY = "rgnt_agt_refund_bot_local"
ADMIN_KEY = "rgnt_admin_walkthrough_local"
AGENT = "agent_refund_bot"


@dataclass
class RunningGate:
    """A started `mock-gate` process."""

    process: subprocess.Popen
    url: str
    binary: Path
    args: list[str]
    cwd: Path
    log: Path
    config: Path | None = None
    extra: dict = field(default_factory=dict)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Runs another `mock-gate` command (approvals, idp-token, audit)."""
        return subprocess.run(
            [str(self.binary), *args], cwd=self.cwd, capture_output=True, text=True, check=check
        )

    def idp_token(self, sub: str, role: str) -> str:
        assert self.config is not None
        return self.cli("idp-token", "--config", str(self.config), "--sub", sub, "--role", role).stdout.strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_gate(binary: Path, args: list[str], cwd: Path, config: Path | None = None) -> RunningGate:
    """Starts `mock-gate ARGS --port 0` and waits for its first stdout line (the URL)."""
    log = cwd / f"mock-gate-{time.monotonic_ns()}.log"
    stderr = log.open("w")
    process = subprocess.Popen(
        [str(binary), *args, "--port", "0"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    line = process.stdout.readline() if process.stdout else ""
    if "listening on " not in line:
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(f"mock-gate did not start: {line!r}\n{log.read_text()}")
    url = line.split("listening on ", 1)[1].split()[0]
    gate = RunningGate(process, url, binary, args, cwd, log, config)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return gate
        except httpx.TransportError:
            time.sleep(0.05)
    gate.stop()
    raise AssertionError("mock-gate never became healthy")


def copy_walkthrough(dest: Path, extra_yaml: str = "", replace: dict[str, str] | None = None) -> Path:
    """The shipped walkthrough configuration, copied (state stays in `dest`)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(WALKTHROUGH / "policy.cedar", dest / "policy.cedar")
    text = (WALKTHROUGH / "gate.yaml").read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    (dest / "gate.yaml").write_text(text + extra_yaml)
    return dest / "gate.yaml"
