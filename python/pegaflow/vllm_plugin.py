"""Optional ``vllm.general_plugins`` entry point: registers PegaKVConnector by name, so
``{"kv_connector": "PegaKVConnector"}`` works even without kv_connector_module_path."""

from __future__ import annotations


def register() -> None:
    try:
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    except ImportError:  # vLLM absent or too old: nothing to register with
        return
    try:
        KVConnectorFactory.register_connector("PegaKVConnector", "pegaflow.connector",
                                              "PegaKVConnector")
    except ValueError:
        pass  # already registered (plugins load once per process, but be idempotent)
