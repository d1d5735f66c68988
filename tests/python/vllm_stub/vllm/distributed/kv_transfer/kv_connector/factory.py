"""Stub of kv_connector/factory.py as on vLLM main: name registry with lazy loaders;
``kv_connector_module_path`` is imported *before* the registry is consulted, and a class
loaded that way must accept ``kv_cache_config`` (else ValueError: main removed the
2-argument fallback); ``create_connector`` always passes three arguments."""

import importlib
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    supports_hma,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = logging.getLogger(__name__)


def supports_kw(callable_, kw_name: str) -> bool:
    """vllm.utils.func_utils.supports_kw (the cases the factory relies on)."""
    params = inspect.signature(callable_).parameters
    if kw_name in params:
        return params[kw_name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        inspect.Parameter.KEYWORD_ONLY)
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())


class KVConnectorFactory:
    _registry: dict[str, Callable[[], type[KVConnectorBase_V1]]] = {}

    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader() -> type[KVConnectorBase_V1]:
            module = importlib.import_module(module_path)
            return getattr(module, class_name)

        cls._registry[name] = loader

    @classmethod
    def create_connector(cls, config: "VllmConfig", role: KVConnectorRole,
                         kv_cache_config: "KVCacheConfig") -> KVConnectorBase_V1:
        kv_transfer_config = config.kv_transfer_config
        if kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls = cls.get_connector_class(kv_transfer_config)
        hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        if hma_enabled and not cls.supports_hma_config(kv_transfer_config):
            raise ValueError(f"Connector {connector_cls.__name__} does not support HMA but "
                             "HMA is enabled. Please set `--disable-hybrid-kv-cache-manager`.")
        logger.info("Creating v1 connector with name: %s and engine_id: %s",
                    connector_cls.__name__, kv_transfer_config.engine_id)
        return connector_cls(config, role, kv_cache_config)

    @classmethod
    def get_connector_class_by_name(cls, connector_name: str) -> type[KVConnectorBase_V1]:
        if connector_name not in cls._registry:
            raise ValueError(f"Connector '{connector_name}' is not registered.")
        return cls._registry[connector_name]()

    @classmethod
    def get_connector_class(cls, kv_transfer_config: "KVTransferConfig"
                            ) -> type[KVConnectorBase_V1]:
        connector_name = kv_transfer_config.kv_connector
        if connector_name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        module_path = kv_transfer_config.kv_connector_module_path
        if module_path is not None and not module_path:
            raise ValueError("kv_connector_module_path cannot be an empty string.")
        if module_path:
            module = importlib.import_module(module_path)
            try:
                connector_cls = getattr(module, connector_name)
            except AttributeError as e:
                raise AttributeError(f"Class {connector_name} not found in {module_path}") from e
            if not supports_kw(connector_cls, "kv_cache_config"):
                msg = (f"Connector {connector_cls.__name__} uses deprecated 2-argument "
                       "constructor signature. External v1 KV connectors must accept "
                       "kv_cache_config as the third constructor argument and pass it to "
                       "super().__init__().")
                logger.error(msg)
                raise ValueError(msg)
        elif connector_name in cls._registry:
            connector_cls = cls._registry[connector_name]()
        else:
            raise ValueError(f"Unsupported connector type: {connector_name}")
        return connector_cls

    @classmethod
    def supports_hma_config(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        # (MultiConnector's per-child check is not modelled.)
        return supports_hma(cls.get_connector_class(kv_transfer_config))
