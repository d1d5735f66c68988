"""Manual GPU check of the CUDA path (needs torch with CUDA and pegaflow-server started
with --gpu-backend cuda; not run by `make test`).

    python tests/python/manual/cuda_roundtrip.py 127.0.0.1:50055

Registers a FlashAttention-shaped bf16 KV cache (2, N, 16, 8, 128) from cuda:0 through
CudaDeviceAdapter (torch's _share_cuda_ handle + the device UUID), saves seeded blocks,
loads them into other blocks through a lease and load_state_shm, compares bytes on the GPU.
With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it must stop at registration with
the "expandable segments" message instead. Exit 0 = pass."""

import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "python"))

import torch  # noqa: E402

from pegaflow.client.engine import EngineClient  # noqa: E402
from pegaflow.connector.config import ConnectorContext  # noqa: E402
from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan  # noqa: E402
from pegaflow.connector.worker import WorkerConnector  # noqa: E402
from pegaflow.device.cuda import CudaDeviceAdapter, UnsupportedAllocation  # noqa: E402


def main(target: str) -> int:
    torch.manual_seed(0)
    torch.cuda.set_device(0)
    n = 64
    kv = torch.zeros((2, n, 16, 8, 128), dtype=torch.bfloat16, device="cuda:0")
    client = EngineClient(target)
    ctx = ConnectorContext("cuda-rt-" + uuid.uuid4().hex[:6], "cuda-roundtrip", 16)
    dev = CudaDeviceAdapter(client.lib, 0)
    w = WorkerConnector(ctx, client, dev, save_thread=False)
    try:
        w.register_kv_caches({"layer0": kv})
    except RuntimeError as e:
        if isinstance(e.__cause__, UnsupportedAllocation) or "expandable" in str(e):
            print("refused as expected:", e)
            return 0 if "expandable_segments" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else 1
        raise
    except UnsupportedAllocation as e:
        print("refused as expected:", e)
        return 0 if "expandable_segments" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") else 1
    src = [3, 10, 11, 40]
    dst = [50, 51, 52, 53]
    kv[:, src] = torch.randn((2, len(src), 16, 8, 128), device="cuda:0").to(torch.bfloat16)
    hashes = [bytes([i]) * 32 for i in range(1, len(src) + 1)]
    w.wait_for_save(StepPlan(saves={"a": SaveIntent(tuple(src), tuple(hashes))}))
    deadline = time.monotonic() + 10
    while True:
        q = client.query_raw(ctx.instance_id, "b", hashes)
        if q.num_hit_blocks == len(src):
            break
        if q.lease:
            client.release(q.lease)
        if time.monotonic() > deadline:
            print("saved blocks never became visible")
            return 1
        time.sleep(0.02)
    w.start_load_kv(StepPlan(loads={"b": LoadIntent(tuple(dst), q.lease, 4 * 16)}))
    while True:
        sending, recving = w.get_finished(set())
        if recving:
            break
        time.sleep(0.005)
    errs = w.get_block_ids_with_load_errors()
    torch.cuda.synchronize(0)
    ok = not errs and torch.equal(kv[:, src], kv[:, dst])
    print("errors:", errs, "equal:", ok)
    w.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50055"))
