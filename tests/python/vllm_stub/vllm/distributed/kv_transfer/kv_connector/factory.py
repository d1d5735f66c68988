"""Stub of kv_connector/factory.py: name registry, module-path import, and the
``kv_cache_config`` keyword check that picks the 3- or 2-argument constructor."""

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

logger = logging.getLogger(__name__)


def supports_kw(callable_, kw_name: str) -> bool:
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
                         kv_cache_config: "KVCacheConfig | None" = None) -> KVConnectorBase_V1:
        kv_transfer_config = config.kv_transfer_config
        if kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls = cls.get_connector_class(kv_transfer_config)
        hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        if hma_enabled and not supports_hma(connector_cls):
            raise ValueError(f"Connector {connector_cls.__name__} does not support HMA but "
                             "HMA is enabled. Please set `--disable-hybrid-kv-cache-manager`.")
        logger.info("Creating v1 connector with name: %s and engine_id: %s",
                    connector_cls.__name__, kv_transfer_config.engine_id)
        if supports_kw(connector_cls, "kv_cache_config"):
            return connector_cls(config, role, kv_cache_config)
        logger.warning("Connector %s uses deprecated signature with 2 required arguments.",
                       connector_cls.__name__)
        return connector_cls(config, role)

    @classmethod
    def get_connector_class(cls, kv_transfer_config) -> type[KVConnectorBase_V1]:
        connector_name = kv_transfer_config.kv_connector
        if connector_name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        if connector_name in cls._registry:
            return cls._registry[connector_name]()
        module_path = kv_transfer_config.kv_connector_module_path
        if module_path is None:
            raise ValueError(f"Unsupported connector type: {connector_name}")
        connector_module = importlib.import_module(module_path)
        try:
            return getattr(connector_module, connector_name)
        except AttributeError as e:
            raise AttributeError(f"Class {connector_name} not found in {module_path}") from e
