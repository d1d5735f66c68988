"""Test stub of the vLLM interfaces PegaKVConnector touches (NOT vLLM).

Follows vLLM main: kv_connector/v1/base.py as at commit 003df2961dd8 (3-argument
constructor, handle_preemptions(metadata), set_xfer_handshake_metadata_pp_aware,
num_publishable_block_hashes in its docstrings), and, for the other files, the main
branch as read in 2026 (factory loading kv_connector_module_path first and refusing
2-argument constructors; KVCacheBlock.set_block_hash; Request without eos_token_id;
RequestStatus with WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR / FINISHED_REPETITION;
resolve_kv_cache_block_sizes; the fixed default NONE_HASH seed; metrics.py and
kv_events.py). docs/connector.md lists, file by file, which commits were compared.
tests/python/test_stub_conformance.py compares the stub with vLLM sources
(PEGAFLOW_VLLM_SRC=DIR) or an installed vLLM.

conftest.py puts this package on sys.path only when ``importlib.util.find_spec("vllm")``
finds no real vLLM, so it can never shadow one.
"""

STUB = True
PINNED_VLLM = {
    "repository": "https://github.com/vllm-project/vllm",
    "commit": "003df2961dd8830c317a61f9745ccd557da9fa06",
    "release_line": "vLLM main, 2026 (API of the 0.2x releases PegaFlow v0.23.12 targets)",
    "files": "see docs/connector.md, 'vLLM versions the stub follows'",
}
__version__ = "0.0.0+pegaflow-stub.003df29"
