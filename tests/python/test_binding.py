"""The ctypes binding matches src/client/pegaflow.h, finds the library, maps errors,
and (with the library) keeps deadlines and releases the GIL."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import TOP
from pegaflow.client import _lib, errors
from pegaflow.client.engine import EngineClient, QueryResult, pack_hashes

HEADER = os.path.join(TOP, "src", "client", "pegaflow.h")


def _header_text() -> str:
    with open(HEADER) as f:
        return f.read()


def _declared_functions() -> dict[str, int]:
    """name -> number of parameters, from the prototypes in pegaflow.h."""
    text = re.sub(r"/\*.*?\*/", "", _header_text(), flags=re.S)
    out = {}
    for m in re.finditer(r"\b(pf_\w+)\s*\(([^;{]*?)\)\s*;", text, flags=re.S):
        params = m.group(2).strip()
        out[m.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    return out


def test_every_header_function_is_declared_with_its_arity():
    declared = _declared_functions()
    assert declared, "no prototypes parsed from pegaflow.h"
    assert set(declared) == set(_lib.PROTOTYPES), (
        f"header only: {sorted(set(declared) - set(_lib.PROTOTYPES))}, "
        f"binding only: {sorted(set(_lib.PROTOTYPES) - set(declared))}")
    for name, n in declared.items():
        assert len(_lib.PROTOTYPES[name][1]) == n, name


def test_struct_layouts_match_the_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("SKIP: no C compiler to compile pegaflow.h")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "pegaflow.h"',
             'int main(void) {', 'printf("{");']
    first = True
    for cname, cls in _lib.STRUCTS.items():
        for fname, _ in cls._fields_:
            sep = "" if first else ","
            first = False
            lines.append(f'printf("{sep}\\"{cname}.{fname}\\": %zu", '
                         f'offsetof(struct {cname}, {fname}));')
        lines.append(f'printf(",\\"{cname}\\": %zu", sizeof(struct {cname}));')
    lines += ['printf("}\\n");', "return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=c11", "-I", os.path.dirname(HEADER), "-o", str(exe), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c = json.loads(subprocess.run([str(exe)], capture_output=True, text=True).stdout)
    for cname, cls in _lib.STRUCTS.items():
        assert ctypes.sizeof(cls) == c[cname], cname
        for fname, _ in cls._fields_:
            assert getattr(cls, fname).offset == c[f"{cname}.{fname}"], f"{cname}.{fname}"


def test_lease_len_matches_header():
    m = re.search(r"#define\s+PF_LEASE_LEN\s+(\d+)", _header_text())
    assert m and int(m.group(1)) == _lib.PF_LEASE_LEN


# ------------------------------------------------------------------ finding the library


def test_not_found_error_names_every_place_searched(tmp_path):
    # In a fresh process: once libpegaflow.so is loaded, dlopen("libpegaflow.so") finds it.
    import sys

    code = ("from pegaflow.client import _lib\n"
            "try:\n    _lib.load_library()\nexcept _lib.LibraryError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(PEGAFLOW_LIB=str(tmp_path / "nope.so"), PYTHONPATH=os.path.join(TOP, "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    msg = r.stdout
    assert "libpegaflow not found" in msg, r.stdout + r.stderr
    assert "$PEGAFLOW_LIB" in msg and str(tmp_path / "nope.so") in msg
    assert "next to the package" in msg and os.path.join("pegaflow", "lib") in msg
    assert "system library path" in msg


def test_candidates_order_and_directory_form(tmp_path):
    c = _lib.candidates({"PEGAFLOW_LIB": str(tmp_path)})
    assert c[0] == ("$PEGAFLOW_LIB", str(tmp_path / "libpegaflow.so"))
    assert c[1][0] == "next to the package" and c[1][1].endswith("pegaflow/lib/libpegaflow.so")
    assert c[-1] == ("system library path (dlopen)", "libpegaflow.so")


def test_a_library_that_is_not_libpegaflow_is_refused():
    import ctypes.util as cu

    libc = cu.find_library("c")
    with pytest.raises(_lib.LibraryError, match="not libpegaflow"):
        _lib.Lib(ctypes.CDLL(libc), libc)


def test_found_through_pegaflow_lib(lib):
    env = {"PEGAFLOW_LIB": os.path.dirname(lib.path)}
    found = _lib.load_library(env=env)
    assert found.path == lib.path
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", found.version())


def test_missing_function_is_a_clear_error(lib):
    fake = _lib.Lib.__new__(_lib.Lib)
    fake.path, fake._fns, fake.missing = "libx.so", {}, ["pf_client_save"]
    with pytest.raises(_lib.LibraryError, match="lacks pf_client_save.*older than the connector"):
        fake.fn("pf_client_save")


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("rc,code,cls", [
    (-111, errors.UNAVAILABLE, errors.Unavailable),
    (-110, errors.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
    (-22, errors.INVALID_ARGUMENT, errors.InvalidArgument),
    (-1, errors.FAILED_PRECONDITION, errors.FailedPrecondition),
    (-5, errors.INTERNAL, errors.Internal),
    (-95, errors.UNIMPLEMENTED, errors.Unimplemented),
    (-111, 0, errors.Unavailable),       # local failure: errno decides
    (-110, 0, errors.DeadlineExceeded),
    (-12, 0, errors.PegaflowError),      # ENOMEM
])
def test_error_mapping(rc, code, cls):
    e = errors.error_for("pf_client_x", rc, code, "boom")
    assert type(e) is cls
    assert "pf_client_x" in str(e)
    # with no status recorded on the thread, the message comes from the errno
    assert ("boom" in str(e)) == (code != 0)


def test_a_stale_status_is_not_attributed_to_a_local_failure():
    # -ENOMEM decided locally while the thread still records an old UNAVAILABLE
    e = errors.error_for("pf_client_connect", -12, errors.UNAVAILABLE, "old failure")
    assert type(e) is errors.PegaflowError and "old failure" not in str(e)
    assert "ENOMEM" in str(e)
    e = errors.error_for("pf_client_x", -71, errors.DATA_LOSS, "data loss")  # -EPROTO
    assert e.code == errors.DATA_LOSS and "data loss" in str(e)


def test_version_mismatch_is_recognised():
    e = errors.error_for("pf_client_register", -1, errors.FAILED_PRECONDITION,
                         "PegaFlow version mismatch: client=1 server=2")
    assert isinstance(e, errors.VersionMismatch) and isinstance(e, errors.FailedPrecondition)


def test_query_maps_unreachable_to_a_miss_and_raises_the_rest():
    c = EngineClient.__new__(EngineClient)
    for exc in (errors.Unavailable("q", -111, 14, "down"),
                errors.DeadlineExceeded("q", -110, 4, "slow")):
        c.query_raw = lambda *a, _e=exc, **k: (_ for _ in ()).throw(_e)
        assert c.query("i", "r", [b"h"]) == QueryResult.miss()
    c.query_raw = lambda *a, **k: (_ for _ in ()).throw(
        errors.FailedPrecondition("q", -1, 9, "instance x not found"))
    with pytest.raises(errors.FailedPrecondition):
        c.query("i", "r", [b"h"])


def test_pack_hashes_uniform_and_mixed():
    k, p, lk, lp, n = pack_hashes([b"a" * 32, b"b" * 32])
    assert lp is None and n == 32 and bytes(k) == b"a" * 32 + b"b" * 32
    k, p, lk, lp, n = pack_hashes([b"a" * 32, b"b" * 16])
    assert n == 0 and list(lk) == [32, 16]
    k, p, lk, lp, n = pack_hashes([])
    assert p is None and n == 0


# ------------------------------------------------------------------ with the library


def test_health_on_a_closed_port_is_unavailable_within_the_deadline(lib):
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = EngineClient(f"127.0.0.1:{port}", lib=lib, timeout_ms=2000)
    t = time.monotonic()
    with pytest.raises(errors.Unavailable) as ei:
        c.health()
    assert time.monotonic() - t < 5
    assert ei.value.code == errors.UNAVAILABLE and ei.value.rc == -111
    c.close()


def test_bad_target_is_invalid_argument(lib):
    with pytest.raises(errors.InvalidArgument, match="host:port"):
        EngineClient("not a target", lib=lib)


def test_query_against_no_server_is_a_miss(lib):
    assert lib.has("pf_client_query"), "libpegaflow lacks pf_client_query"
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = EngineClient(f"127.0.0.1:{port}", lib=lib, query_timeout_ms=500)
    assert c.query("inst", "req", [b"\1" * 32]) == QueryResult.miss()
    c.close()


# ------------------------------------------------------------------ security environment


def test_unreadable_tls_ca_fails_the_connect_naming_the_variable(lib, monkeypatch):
    monkeypatch.setenv("PEGAFLOW_TLS_CA", "/nonexistent/ca.pem")
    with pytest.raises(errors.InvalidArgument, match="PEGAFLOW_TLS_CA: cannot open /nonexistent/ca.pem"):
        EngineClient("127.0.0.1:1", lib=lib)


def test_cert_without_key_fails_the_connect(lib, monkeypatch, tmp_path):
    crt = tmp_path / "c.pem"
    crt.write_text("-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("PEGAFLOW_TLS_CERT", str(crt))
    monkeypatch.delenv("PEGAFLOW_TLS_KEY", raising=False)
    with pytest.raises(errors.InvalidArgument, match="PEGAFLOW_TLS_CERT and PEGAFLOW_TLS_KEY"):
        EngineClient("127.0.0.1:1", lib=lib)


def test_unix_target_is_accepted(lib, tmp_path):
    c = EngineClient(f"unix:{tmp_path}/none.sock", lib=lib, timeout_ms=2000)
    with pytest.raises(errors.Unavailable):
        c.health()
    c.close()
