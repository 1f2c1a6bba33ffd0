"""Records every tool invocation of a `phrony` SDK worker, without touching the worker's code.

Put this directory on `PYTHONPATH` and name a file in `PHRONY_TEST_INVOCATION_LOG`: Python
imports this module at start-up, and it wraps each handler `Worker.register_tool` (and so the
`@worker.tool` decorator) receives. Every call then appends one JSON line to the file — the tool,
version, call id, session id and arguments when the handler starts, and the result (or the
exception) when it ends — so a test can prove which handlers ran, and which never did.
"""

from __future__ import annotations

import inspect
import json
import os
import threading

_LOG = os.environ.get("PHRONY_TEST_INVOCATION_LOG")

if _LOG:
    from phrony.worker.worker import Worker

    _lock = threading.Lock()
    _register_tool = Worker.register_tool

    def _record(entry: dict) -> None:
        line = json.dumps(entry, default=str)
        with _lock, open(_LOG, "a", encoding="utf-8") as log:
            log.write(line + "\n")

    def register_tool(self, *, tool, version, handler, **options):
        async def recorded(args, ctx):
            base = {"tool": tool, "version": version, "call_id": ctx.call_id, "session_id": ctx.session_id}
            _record({**base, "event": "invoked", "args": args})
            try:
                result = handler(args, ctx)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as error:
                _record({**base, "event": "raised", "error": repr(error)})
                raise
            _record({**base, "event": "returned", "result": result})
            return result

        return _register_tool(self, tool=tool, version=version, handler=recorded, **options)

    Worker.register_tool = register_tool
