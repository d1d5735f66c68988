"""PegaFlow-C: the vLLM KV connector and the ctypes binding of libpegaflow.

Importing this package has no side effects: no vllm, no torch, no library loading,
no sockets, no threads. vLLM loads the connector with
``kv_connector_module_path = "pegaflow.connector"``, ``kv_connector = "PegaKVConnector"``.
"""

from pegaflow._version import __version__

__all__ = ["__version__"]
