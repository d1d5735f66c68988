"""The torch half of tests/gpu/first-contact.sh (docs/gpu.md "First contact"): the
connector's own code (pegaflow.device.cuda, pegaflow.connector.worker) against a real
torch and a running ``pegaflow-server --gpu-backend cuda``.

    PYTHONPATH=python PEGAFLOW_LIB=build/rel/lib/libpegaflow.so \\
        python3 tests/gpu/first_contact.py --server 127.0.0.1:PORT [--device 0] [--seed N]

Prints one line per check (``PASS name: detail`` / ``FAIL name: detail`` / ``SKIP ...``).
Exit 0 all passed, 1 a check failed, 77 no torch with CUDA.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
import uuid

FAILED = []


def line(status: str, name: str, detail: str) -> None:
    print(f"{status} {name}: {detail}", flush=True)
    if status == "FAIL":
        FAILED.append(name)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--refusal-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"SKIP torch: not importable ({e})")
        return 77
    if not torch.cuda.is_available():
        print("SKIP torch: torch.cuda.is_available() is False (CPU-only torch or no GPU)")
        return 77
    from pegaflow.device.cuda import CudaDeviceAdapter, UnsupportedAllocation, parse_share_cuda

    dev = a.device
    torch.cuda.set_device(dev)
    if a.refusal_only:  # child process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        t = torch.zeros((2, 64, 16, 8, 128), dtype=torch.bfloat16, device=f"cuda:{dev}")
        try:
            CudaDeviceAdapter(None, dev).share(t)
        except UnsupportedAllocation as e:
            ok = "expandable_segments:False" in str(e)
            line("PASS" if ok else "FAIL", "expandable-refusal", str(e)[:160])
            return 0 if ok else 1
        line("FAIL", "expandable-refusal", "an expandable-segment tensor was exported")
        return 1

    props = torch.cuda.get_device_properties(dev)
    line("PASS", "torch", f"torch {torch.__version__}, CUDA runtime {torch.version.cuda}, "
         f"cuda:{dev} = {props.name} (sm_{props.major}{props.minor}), "
         f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}")

    from pegaflow.client import _lib
    from pegaflow.client.engine import EngineClient
    from pegaflow.connector.config import ConnectorContext
    from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan
    from pegaflow.connector.worker import WorkerConnector

    lib = _lib.load_library()
    n, bs = 64, 16
    layers = ["layer0", "layer1"]
    # 4 MiB each: the caching allocator splits one 20 MiB segment for requests between 1
    # and 10 MiB (kLargeBuffer), so layer1 normally starts at a non-zero segment offset
    kv = {name: torch.zeros((2, n, bs, 8, 128), dtype=torch.bfloat16, device=f"cuda:{dev}")
          for name in layers}

    # 1. torch's handle format, as the connector parses it
    try:
        desc = []
        for name in layers:
            raw = kv[name].untyped_storage()._share_cuda_()
            s = parse_share_cuda(raw)
            desc.append(f"{name}: {len(raw[1])}-byte handle, version {s.version}, type 'c', "
                        f"segment offset {s.offset}, {s.size} bytes")
        line("PASS", "handle-format", "; ".join(desc))
    except Exception as e:  # noqa: BLE001 - report, do not stop
        line("FAIL", "handle-format", f"{type(e).__name__}: {e}")
        return 1

    # 2. register through the connector's own code
    client = EngineClient(a.server, lib=lib)
    ctx = ConnectorContext("first-contact-" + uuid.uuid4().hex[:6], "first-contact", bs)
    adapter = CudaDeviceAdapter(lib, dev)
    w = WorkerConnector(ctx, client, adapter, save_thread=True)
    try:
        w.register_kv_caches(kv)
        line("PASS", "register", f"{len(layers)} layers of {tuple(kv['layer0'].shape)} bf16, "
             "RegisterContextBatch accepted by the cuda backend")
    except Exception as e:  # noqa: BLE001
        line("FAIL", "register", f"{type(e).__name__}: {e}")
        return 1

    try:
        return _save_load(a, torch, client, ctx, w, kv, n, bs, LoadIntent, SaveIntent,
                          StepPlan)
    finally:
        w.shutdown()


def _save_load(a, torch, client, ctx, w, kv, n, bs, LoadIntent, SaveIntent, StepPlan) -> int:
    dev = a.device
    src, dst = [3, 10, 11, 40], [50, 51, 52, 53]
    hashes = [uuid.uuid4().bytes * 2 for _ in src]
    gen = torch.Generator(device=f"cuda:{dev}").manual_seed(a.seed)

    # 3. save ordered by the fence: the "forward pass" writes the blocks, then a long
    # kernel is queued after the save was issued; the save must not wait for it
    for t in kv.values():
        t[:, src] = torch.randn((2, len(src), bs, 8, 128), device=f"cuda:{dev}",
                                generator=gen).to(torch.bfloat16)
    w.wait_for_save(StepPlan(saves={"a": SaveIntent(tuple(src), tuple(hashes))}))
    sleeper = getattr(torch.cuda, "_sleep", None)
    if sleeper is not None:
        sleeper(int(4e9))  # ~2 s of GPU cycles queued behind the save's fence
    idle = w.wait_saves_idle(60)
    busy = sleeper is not None and not torch.cuda.current_stream(dev).query()
    if not idle or w.stats["saves"] != 1 or w.stats["save_failures"]:
        line("FAIL", "save", f"idle={idle} stats={dict(w.stats)}")
        return 1
    line("PASS", "save", f"{len(src)} blocks x {len(kv)} layers saved")
    if sleeper is None:
        line("SKIP", "save-fence", "torch.cuda._sleep missing: cannot queue later work")
    elif busy:
        line("PASS", "save-fence", "the save finished while later GPU work was still running")
    else:
        line("FAIL", "save-fence", "the later kernel had finished when the save did: the "
             "save waited for work queued after the forward pass")
    torch.cuda.synchronize(dev)

    # 4. query + load into other blocks, byte-exact
    deadline = time.monotonic() + 20
    while True:
        q = client.query_raw(ctx.instance_id, "b", hashes)
        if q.num_hit_blocks == len(src):
            break
        if q.lease:
            client.release(q.lease)
        if time.monotonic() > deadline:
            line("FAIL", "query", f"{q.num_hit_blocks}/{len(src)} blocks visible after 20 s")
            return 1
        time.sleep(0.02)
    line("PASS", "query", f"{len(src)}/{len(src)} blocks hit")
    w.start_load_kv(StepPlan(loads={"b": LoadIntent(tuple(dst), q.lease, len(src) * bs)}))
    deadline = time.monotonic() + 30
    while True:
        _, recving = w.get_finished(set())
        if recving:
            break
        if time.monotonic() > deadline:
            line("FAIL", "load", "not finished after 30 s")
            return 1
        time.sleep(0.005)
    errs = w.get_block_ids_with_load_errors()
    torch.cuda.synchronize(dev)
    bad = []
    for name, t in kv.items():
        for s, d in zip(src, dst):
            for k in range(2):
                a_ = t[k, s].contiguous().view(torch.uint8).cpu().numpy().tobytes()
                b_ = t[k, d].contiguous().view(torch.uint8).cpu().numpy().tobytes()
                if a_ != b_ or not any(a_):
                    bad.append(f"{name}[{k},{s}->{d}]")
    if errs or bad:
        line("FAIL", "load", f"load errors {sorted(errs)}, differing blocks {bad[:8]}")
        return 1
    line("PASS", "load", f"{len(dst)} blocks x {len(kv)} layers x K/V byte-exact "
         f"(seed {a.seed})")

    # 5. the expandable-segments refusal (needs a fresh process: the allocator reads
    # PYTORCH_CUDA_ALLOC_CONF once)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    r = subprocess.run([sys.executable, __file__, "--server", a.server, "--device", str(dev),
                        "--refusal-only"], env=env, capture_output=True, text=True,
                       timeout=120)
    out = (r.stdout + r.stderr).strip().splitlines()
    mine = [ln for ln in out if ln.startswith(("PASS", "FAIL"))]
    if mine:
        print(mine[-1], flush=True)
        if mine[-1].startswith("FAIL"):
            FAILED.append("expandable-refusal")
    else:
        line("FAIL", "expandable-refusal", f"exit {r.returncode}: {out[-3:]}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        print("FAIL first_contact.py: unexpected exception")
        sys.exit(1)
