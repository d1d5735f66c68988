"""Test stub of the vLLM interfaces PegaKVConnector touches (NOT vLLM).

Pinned to vLLM main at commit 003df2961dd8830c317a61f9745ccd557da9fa06 (the 2026
``kv_connector/v1/base.py`` studied in shared/reference/vllm-connector.md §1: 3-argument
constructor with ``kv_cache_config``, ``handle_preemptions(kv_connector_metadata)``,
``CachedRequestData.resumed_req_ids``, bytes block hashes, sha256 default). Signatures
and behaviour are written to match that commit; tests/python/test_stub_conformance.py
compares them with a real vLLM wherever one is importable.

conftest.py puts this package on sys.path only when ``importlib.util.find_spec("vllm")``
finds no real vLLM, so it can never shadow one.
"""

STUB = True
PINNED_VLLM = {
    "repository": "https://github.com/vllm-project/vllm",
    "commit": "003df2961dd8830c317a61f9745ccd557da9fa06",
    "release_line": "vLLM main, 2026 (API of the 0.2x releases PegaFlow v0.23.12 targets)",
}
__version__ = "0.0.0+pegaflow-stub.003df29"
