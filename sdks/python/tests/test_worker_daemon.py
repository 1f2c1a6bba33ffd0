"""This SDK's Worker against the real daemon, with code written for 0.1.0
(`tests/python/workers/refund_worker.py`, unchanged): it registers, survives a daemon restart
by registering again on the same address, and SIGTERM drains it and ends it with exit code 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runtime_daemon import RuntimeDaemon

WORKER = Path(__file__).resolve().parents[3] / "tests" / "python" / "workers" / "refund_worker.py"


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def registered(daemon: RuntimeDaemon, worker_id: str) -> bool:
    return any("work stream open" in line and worker_id in line for line in daemon.log().splitlines())


def test_the_worker_registers_again_after_a_daemon_restart_and_drains_on_sigterm(runtime_binary, tmp_path):
    first = RuntimeDaemon(runtime_binary, tmp_path)
    first.start()
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), "sdk-worker-restart"],
        env={**os.environ, "PHRONY_RUNTIME_ADDR": first.address},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second: RuntimeDaemon | None = None
    try:
        wait_for(lambda: registered(first, "sdk-worker-restart"), "the first registration")
        assert first.stop() == 0, first.log()
        time.sleep(1.0)
        assert worker.poll() is None, "the worker gave up when the daemon stopped"

        second = RuntimeDaemon(runtime_binary, tmp_path)
        second.address = first.address  # the same daemon coming back: same address, same database
        second.start()
        wait_for(lambda: registered(second, "sdk-worker-restart"), "the registration after the restart")
        assert worker.poll() is None

        worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if second is not None:
            second.stop()
    assert worker.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert stdout.splitlines()[-1:] == ["stream closed"], stdout
