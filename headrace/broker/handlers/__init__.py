"""The API handler table: one module per Kafka API key, discovered in this package.

Each handler module defines::

    API_KEY: int                 # Kafka's api key
    MIN_VERSION: int             # the versions it implements, inclusive
    MAX_VERSION: int
    async def handle(ctx: RequestContext, request) -> response | None

``handle`` receives kio's request dataclass for the negotiated version and returns kio's
response dataclass (usually ``ctx.respond({...})``), a ``RawResponse`` of bytes and file
slices (zero-copy fetch), or None when no response is sent (acks=0 produce).
ApiVersions is derived from this table, so it advertises exactly what is implemented.
Read-only after import; thread-safe.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True, slots=True)
class ApiHandler:
    api_key: int
    min_version: int
    max_version: int
    module: ModuleType

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


def _discover() -> dict[int, ApiHandler]:
    table: dict[int, ApiHandler] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if not hasattr(module, "API_KEY"):
            continue
        handler = ApiHandler(module.API_KEY, module.MIN_VERSION, module.MAX_VERSION, module)
        if handler.api_key in table:
            raise RuntimeError(f"two handlers for api key {handler.api_key}: {info.name}")
        table[handler.api_key] = handler
    return dict(sorted(table.items()))


HANDLERS: dict[int, ApiHandler] = _discover()
