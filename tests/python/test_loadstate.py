"""load_state_shm: our reader/writer follows the layout of DESIGN §4 / reference §3.6 and
interoperates with libpegaflow's pf_loadstate_*."""

from __future__ import annotations

import os
import struct

import pytest

from pegaflow.client import loadstate
from pegaflow.client.loadstate import CLoadState, ShmLoadState, create_load_state


def _raw(name: str) -> bytes:
    with open(os.path.join("/dev/shm", name), "rb") as f:
        return f.read()


def test_layout_and_lifecycle():
    s = ShmLoadState.create()
    try:
        assert s.name.startswith("pega_load_") and len(s.name) == len("pega_load_") + 32
        raw = _raw(s.name)
        assert len(raw) == loadstate.SHM_SIZE
        (off,) = struct.unpack_from("=Q", raw, 0)
        assert off % 8 == 0 and off == 8
        magic, version, state = struct.unpack_from("=IIq", raw, off)
        assert (magic, version, state) == (0x50464C44, 1, 0)
        assert raw[off:off + 4] == b"DLFP"  # 'PFLD' little-endian
        w = ShmLoadState.attach("/" + s.name)  # the server's view, leading '/' accepted
        w.set(1)
        assert s.get() == 1
        assert struct.unpack_from("=q", _raw(s.name), off + 8)[0] == 1
        w.close()
        assert os.path.exists(os.path.join("/dev/shm", s.name))  # attacher does not unlink
    finally:
        s.close()
    assert not os.path.exists(os.path.join("/dev/shm", s.name))
    s.close()  # idempotent


@pytest.mark.parametrize("state,done,ok", [(0, False, False), (1, True, True),
                                           (-1, True, False), (0xFFFFFFFF, True, False),
                                           (2, True, False)])
def test_only_exactly_one_is_success(state, done, ok):
    assert loadstate.state_is_done(state) is done
    assert loadstate.state_is_success(state) is ok


def test_attach_validates(tmp_path):
    name = "pega_load_test_bad_%d" % os.getpid()
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as f:
        f.write(struct.pack("=Q", 8) + struct.pack("=IIq", 0xDEADBEEF, 1, 0) + b"\0" * 8)
    try:
        with pytest.raises(ValueError, match="magic"):
            ShmLoadState.attach(name)
    finally:
        os.unlink(path)
    with open(path, "wb") as f:
        f.write(b"\0" * 8)
    try:
        with pytest.raises(ValueError, match="bytes"):
            ShmLoadState.attach(name)
    finally:
        os.unlink(path)


def test_c_and_python_share_the_layout(lib):
    assert lib.has("pf_loadstate_create", "pf_loadstate_get", "pf_loadstate_name",
                   "pf_loadstate_destroy"), "libpegaflow lacks pf_loadstate_*"
    c = CLoadState(lib)
    try:
        assert c.get() == 0
        w = ShmLoadState.attach(c.name)  # Python plays the server against the C record
        w.set(-1)
        w.close()
        assert c.get() == -1
    finally:
        c.close()
    assert not os.path.exists(os.path.join("/dev/shm", c.name.lstrip("/")))


def test_factory_prefers_the_library(lib):
    s = create_load_state(lib)
    try:
        want = CLoadState if lib.has("pf_loadstate_create") else ShmLoadState
        assert isinstance(s, want)
    finally:
        s.close()
    s = create_load_state(None)
    assert isinstance(s, ShmLoadState)
    s.close()
