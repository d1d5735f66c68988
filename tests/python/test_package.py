"""The package imports cleanly in every vLLM process and installs with pip."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import STUB_DIR, TOP

PY = os.path.join(TOP, "python")


def _run(code: str, extra_path: list[str] | None = None, env_extra: dict | None = None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PY] + (extra_path or []))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)


def _copy_source(tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(PY, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info",
                                                           "*.so"))
    return src


def test_import_has_no_side_effects():
    code = """
import sys, threading
import pegaflow, pegaflow.client, pegaflow.device, pegaflow.connector
import pegaflow.connector.config, pegaflow.connector.layout, pegaflow.connector.plan
import pegaflow.connector.scheduler, pegaflow.connector.worker, pegaflow.vllm_plugin
import pegaflow.device.cuda, pegaflow.device.sim
bad = [m for m in ("torch", "vllm", "numpy") if m in sys.modules]
assert not bad, bad
assert threading.active_count() == 1, threading.enumerate()
from pegaflow.client import _lib
assert _lib._cached is None  # the library is not loaded at import
print("ok")
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_facade_is_loaded_lazily_by_vllm_factory_lookup():
    # vLLM does getattr(importlib.import_module("pegaflow.connector"), "PegaKVConnector").
    code = """
import importlib, sys
m = importlib.import_module("pegaflow.connector")
assert "vllm" not in sys.modules
cls = getattr(m, "PegaKVConnector")
assert "vllm" in sys.modules and "torch" not in sys.modules
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, supports_hma
assert issubclass(cls, KVConnectorBase_V1) and supports_hma(cls)
print(cls.__module__)
"""
    r = _run(code, [STUB_DIR])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "pegaflow.connector._facade"


def test_missing_attribute_is_an_attribute_error():
    import pegaflow.connector as pc

    with pytest.raises(AttributeError):
        pc.NoSuchThing  # noqa: B018


def _need_pip_and_setuptools():
    import importlib.util

    if importlib.util.find_spec("pip") is None or importlib.util.find_spec("setuptools") is None:
        pytest.skip("SKIP: needs pip and setuptools (Debian python3-pip, python3-setuptools)")


def test_pip_installs_the_package(tmp_path):
    """`pip install ./python` (offline here: the build backend comes from Debian's
    python3-setuptools, hence --no-build-isolation; with network the plain command
    works). The installed copy imports and exposes the connector and the entry point."""
    _need_pip_and_setuptools()
    target = tmp_path / "site"
    src = _copy_source(tmp_path)  # setuptools builds in-tree: keep the checkout clean
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("SKIP: pip is not installed for this python")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "pegaflow" / "connector" / "_facade.py").exists()
    assert (target / "pegaflow" / "device" / "cuda.py").exists()
    eps = list(target.glob("pegaflow_c-*.dist-info/entry_points.txt"))
    assert eps and "pegaflow.vllm_plugin:register" in eps[0].read_text()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), STUB_DIR]))
    r = subprocess.run([sys.executable, "-c",
                        "import pegaflow.connector as c, pegaflow; print(c.PegaKVConnector.__name__,"
                        " pegaflow.__file__)"], capture_output=True, text=True, env=env,
                       timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    name, path = r.stdout.split()
    assert name == "PegaKVConnector" and path.startswith(str(target))


def test_wheel_bundles_a_library_copied_into_the_package(tmp_path):
    """A libpegaflow.so placed in pegaflow/lib/ is shipped in the wheel and found
    "next to the package" first after PEGAFLOW_LIB."""
    _need_pip_and_setuptools()
    src = _copy_source(tmp_path)
    (src / "pegaflow" / "lib" / "libpegaflow.so").write_bytes(b"\x7fELF-not-really")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--no-build-isolation", "--no-index", "-w", str(tmp_path / "w"),
                        str(src)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("SKIP: pip is not installed for this python")
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = (tmp_path / "w").glob("*.whl")
    assert "pegaflow/lib/libpegaflow.so" in zipfile.ZipFile(whl).namelist()
