"""vLLM connector package: ``kv_connector_module_path = "pegaflow.connector"``,
``kv_connector = "PegaKVConnector"``.

The facade (which imports vLLM) is loaded on first attribute access (PEP 562), so the
pure submodules (config, layout, plan, scheduler, worker) import without vLLM or torch,
and vLLM's ``getattr(importlib.import_module("pegaflow.connector"), "PegaKVConnector")``
works unchanged.
"""

from __future__ import annotations

_FACADE_NAMES = ("PegaKVConnector", "PegaConnectorMetadata")

__all__ = list(_FACADE_NAMES)


def __getattr__(name: str):
    if name in _FACADE_NAMES:
        from pegaflow.connector import _facade

        return getattr(_facade, name)
    raise AttributeError(f"module 'pegaflow.connector' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_FACADE_NAMES))
