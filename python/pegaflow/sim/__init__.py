"""pegaflow-sim: a local PegaFlow cluster on one machine (docs/simulation.md).

A MetaServer and N pegaflow-server nodes (sim GPUs, the TCP fabric, optional SSD files),
each in its own network namespace when run as root (loopback addresses otherwise), with a
workload replayed through the real vLLM connector (pegaflow.connector.PegaKVConnector,
scheduler and worker side) against the project's vLLM stand-in (tests/python/vllm_stub).

Modules: cli (flags, the run), cluster (namespaces, processes, state file, teardown),
node (the per-node "vLLM" process), engine (the engine-loop model around the connector),
workload (conversations, Zipf system prompts, routing), report (table, JSON, SVG plot),
promtext (Prometheus text parsing).
"""
