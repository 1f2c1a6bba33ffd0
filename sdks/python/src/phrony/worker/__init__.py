"""The tool worker."""

from phrony.worker.types import (
    DEFAULT_MAX_CONCURRENCY,
    CancelSignal,
    ToolError,
    ToolHandlerContext,
    handler_key,
    heartbeat_interval_ms,
)
from phrony.worker.pins import descriptor_pin, descriptor_pin_of, tool_pin_of
from phrony.worker.work_stream import WorkStream, build_handler_advertisements
from phrony.worker.worker import Worker, descriptor_hash_of

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "CancelSignal",
    "ToolError",
    "ToolHandlerContext",
    "WorkStream",
    "Worker",
    "build_handler_advertisements",
    "descriptor_hash_of",
    "descriptor_pin",
    "descriptor_pin_of",
    "handler_key",
    "heartbeat_interval_ms",
    "tool_pin_of",
]
