"""Interactive sessions."""

from phrony.session.interactive_session import InteractiveSession
from phrony.session.types import (
    InteractiveEvent,
    InteractiveSessionAttachOptions,
    InteractiveSessionStartOptions,
    InteractiveToolApprovalOptions,
)

__all__ = [
    "InteractiveEvent",
    "InteractiveSession",
    "InteractiveSessionAttachOptions",
    "InteractiveSessionStartOptions",
    "InteractiveToolApprovalOptions",
]
