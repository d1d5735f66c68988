"""A one-process "vLLM" (scheduler + one TP worker, like vLLM's uniprocess executor) for
the Session test: registers sim KV caches, opens the liveness Session, says READY and
waits to be killed. Usage: session_child.py <target> <libpegaflow path> <instance id>"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))

import numpy as np  # noqa: E402

from pegaflow.client import _lib  # noqa: E402
from pegaflow.client.engine import EngineClient  # noqa: E402
from pegaflow.connector.config import ConnectorContext  # noqa: E402
from pegaflow.connector.scheduler import SchedulerConnector  # noqa: E402
from pegaflow.connector.worker import WorkerConnector  # noqa: E402
from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches  # noqa: E402

target, libpath, instance = sys.argv[1:4]
lib = _lib.load_library(libpath)
ctx = ConnectorContext(instance, "session-test", 16)
kv, tensors = allocate_kv_caches(["l0"], (2, 8, 16, 2, 8), np.uint16, sim_device=0, lib=lib)
worker = WorkerConnector(ctx, EngineClient(target, lib=lib), SimDeviceAdapter(0))
worker.register_kv_caches(tensors)
sched = SchedulerConnector(ctx, EngineClient(target, lib=lib), session_thread=False)
assert sched.session is not None and sched.session.alive(), "Session did not open"
print("READY", flush=True)
while True:
    time.sleep(60)
