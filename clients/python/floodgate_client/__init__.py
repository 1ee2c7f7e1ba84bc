"""floodgate_client: ask Floodgate before calling, report after, fall back
gracefully when denied or when the server is gone.

    from floodgate_client import Client
    client = Client("http://127.0.0.1:50051", fail_mode="local:0.5")
    decision = client.acquire("payments", {"tenant": "acme"})

`AsyncClient` is the same for asyncio (grpc.aio). See README.md for the whole surface.
"""

from ._core import Tls
from ._guard import AsyncGuard, Guard, by_result, guarded
from ._model import (
    Acquire,
    BreakerState,
    Decision,
    FailMode,
    Limit,
    Outcome,
    Priority,
    ReportResult,
    Source,
    Verdict,
)
from ._metered import AsyncMetered, Metered
from ._permit import Permit
from .aio import AsyncClient
from .client import Client
from .errors import (
    ConfigError,
    Denied,
    FloodgateError,
    InvalidArgument,
    ProtocolError,
    ServerError,
    Unavailable,
)

__version__ = "0.5.0"

__all__ = [
    "Acquire",
    "AsyncClient",
    "AsyncGuard",
    "AsyncMetered",
    "BreakerState",
    "Client",
    "ConfigError",
    "Decision",
    "Denied",
    "FailMode",
    "FloodgateError",
    "Guard",
    "InvalidArgument",
    "Limit",
    "Metered",
    "Outcome",
    "Permit",
    "Priority",
    "ProtocolError",
    "ReportResult",
    "ServerError",
    "Source",
    "Tls",
    "Unavailable",
    "Verdict",
    "by_result",
    "guarded",
]
