"""The binding's own cost per call, counted without timing (bench/README.md "connector").

vLLM's scheduler and workers call QueryPrefetch, Save and Load inside every step, so the
ctypes layer over libpegaflow must do a fixed, small amount of work per call:

* no ``ctypes.cast`` (a Python function: ~3 us each, the Load of 8 leases made 30 of them),
  no per-element ctypes array constructor for ids and targets (array.array converts in C,
  one memcpy copies), leases joined, a Save's layers and a Load's items packed into one
  buffer each (one struct.pack_into per layer / lease);
* the Python work (function calls, counted with sys.setprofile on the calling thread,
  Python and C functions both) is the same for 8 and 64 blocks per request and stays under
  the counts this was pinned at (a regression adds calls long before it adds time).

The library is tests/python/c/recorder.c (test_marshalling.py), which checks every
argument the C side receives, so these calls are also checked for what they pass.
"""

from __future__ import annotations

import ctypes
import sys
from collections import Counter


from test_marshalling import cl, rec  # noqa: F401  (fixtures)
from pegaflow.client.engine import LeaseLoad, SaveLayer

# Calls (Python + C) per binding call for 8 layers (Save, Load) / 8 leases (Load), as
# measured at this change (19 / 109 / 80 / 9) with some headroom; the 30 ctypes.cast of the
# Load they replaced alone were 60+ calls (cast and its POINTER type each).
BOUNDS = {"query": 24, "save": 124, "load": 96, "release": 12}


class CallCounter:
    """Function calls (Python and C) made on this thread while active."""

    def __init__(self):
        self.n = 0
        self.what: Counter = Counter()

    def _prof(self, frame, event, arg):
        if event == "call":
            self.n += 1
            self.what[frame.f_code.co_name] += 1
        elif event == "c_call":
            self.n += 1
            self.what[getattr(arg, "__qualname__", repr(arg))] += 1

    def __enter__(self):
        sys.setprofile(self._prof)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        return False


def _calls(cl, nblocks: int) -> dict[str, CallCounter]:
    ids = list(range(nblocks))
    hashes = [bytes([i % 251]) * 32 for i in range(nblocks)]
    layers = [SaveLayer(f"layer.{i}", ids, hashes) for i in range(8)]
    loads = [LeaseLoad(bytes([r]) * 16, [list(range(r * nblocks, (r + 1) * nblocks))])
             for r in range(8)]
    names = [[f"layer.{i}" for i in range(8)]]
    out = {}
    # each call once before counting (first-call work: imports, caches)
    for counted in (False, True):
        steps = {
            "query": lambda: cl.query("inst", "req-1", hashes),
            "save": lambda: cl.save("inst", 0, 0, 0, layers),
            "load": lambda: cl.load("inst", 0, 0, "/pf-ls", names, loads),
            "release": lambda: cl.release(b"L" * 16),
        }
        for name, fn in steps.items():
            c = CallCounter()
            with c:
                fn()
            if counted:
                out[name] = c
    return out


def test_no_ctypes_cast_on_the_hot_path(rec, cl, monkeypatch):
    casts = []
    real = ctypes.cast
    monkeypatch.setattr(ctypes, "cast", lambda *a: casts.append(a) or real(*a))
    _calls(cl, 16)
    assert casts == [], f"{len(casts)} ctypes.cast calls in query/save/load/release"


def test_work_per_call_is_flat_in_blocks_and_bounded(rec, cl):
    small, big = _calls(cl, 8), _calls(cl, 64)
    for name, bound in BOUNDS.items():
        assert small[name].n == big[name].n, (
            f"{name}: {small[name].n} calls for 8 blocks, {big[name].n} for 64: "
            f"{sorted((big[name].what - small[name].what).items())}")
        assert big[name].n <= bound, (
            f"{name}: {big[name].n} calls per call (pinned at <= {bound}): "
            f"{big[name].what.most_common(12)}")


def test_arrays_are_filled_in_c(rec, cl):
    """Ids and targets go through array.array (one C conversion), never through a ctypes
    array constructor called with one argument per block; a Save packs one pf_save_layer
    per layer and a Load one pf_load_item per lease (struct.pack_into, pointers into flat
    buffers), no ctypes object each."""
    big = _calls(cl, 64)
    for name in ("save", "load"):
        per_block = [k for k, v in big[name].what.items() if v >= 64]
        assert not per_block, f"{name}: called once per block: {per_block}"
    for name in ("save", "load"):  # 8 layers / 8 leases
        assert big[name].what["Struct.pack_into"] == 8, name
        ctypes_arrays = [k for k in big[name].what if "_Array_" in k
                         and not k.startswith(("PfLoadItem_Array_", "PfSaveLayer_Array_"))]
        assert not ctypes_arrays, f"{name}: ctypes arrays per layer / lease {ctypes_arrays}"
    # the 8 layers share one id and one hash sequence: converted once
    assert big["save"].what["array.buffer_info"] == 3  # names, ids, hashes

