"""Shared set-up of the connector tests.

* ``python/`` goes on sys.path (the package is tested from the source tree).
* The vLLM stub (tests/python/vllm_stub) goes on sys.path only when no real vLLM is
  importable, so it never shadows one.
* libpegaflow is found through PEGAFLOW_LIB (set by `make test`); when that is set, a
  library that does not load or lacks an engine function fails the tests needing it. Run
  by hand without a build, those tests skip with the reason.
* The real server comes from PF_BIN (set by `make test`); tests needing it skip when
  PF_BIN is unset.
* PF_TEST_NETNS="NS0=IP0,NS1=IP1,..." (set by tests/integration/test_tp_netns.sh only):
  the k-th server a test starts runs in network namespace NSk (``ip netns exec``), gRPC
  and HTTP bound to IPk, so two servers are two "hosts" reached over veth links. Unset
  (every other run): servers on loopback as before.
* Protected by default (docs/security.md): a server in a namespace (worker RPCs from
  another "host") or with P2P (``--metaserver-addr``) gets ``--cluster-token-file`` with
  the run's token (cluster_token_file(): PF_CLUSTER_TOKEN_FILE from
  tests/integration/lib.sh's pf_cluster_token, else a fresh one per pytest run), which
  libpegaflow clients send (PEGAFLOW_TOKEN_FILE).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
STUB_DIR = os.path.join(HERE, "vllm_stub")

sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, HERE)

REAL_VLLM = importlib.util.find_spec("vllm") is not None
if not REAL_VLLM:
    sys.path.insert(0, STUB_DIR)

# The engine functions libpegaflow must export (libpegaflow.map): a build without one of
# them fails the tests that need it, naming what is missing.
ENGINE_FNS = (
    "pf_client_register", "pf_client_save", "pf_client_query", "pf_client_release",
    "pf_client_load", "pf_client_unregister", "pf_client_session_open",
    "pf_client_session_alive", "pf_client_session_close", "pf_loadstate_create",
    "pf_loadstate_name", "pf_loadstate_get", "pf_loadstate_destroy", "pf_simkv_create",
    "pf_simkv_ptr", "pf_simkv_size", "pf_simkv_name", "pf_simkv_ipc", "pf_simkv_destroy",
    "pf_client_ipc_sim", "pf_client_ipc_cuda",
)


def _lib_or_reason():
    from pegaflow.client import _lib

    if not os.environ.get("PEGAFLOW_LIB"):
        guess = os.path.join(TOP, "build", "rel", "lib", "libpegaflow.so")
        if not os.path.exists(guess):
            return None, "PEGAFLOW_LIB is unset and build/rel/lib/libpegaflow.so is absent"
        try:
            return _lib.load_library(guess), None
        except Exception as e:
            return None, str(e)
    try:
        return _lib.load_library(), None
    except Exception as e:
        return None, f"libpegaflow cannot be loaded: {e}"


@pytest.fixture(scope="session")
def lib():
    lib, why = _lib_or_reason()
    if lib is None:
        if os.environ.get("PEGAFLOW_LIB"):  # `make test` built it: not loading is a failure
            pytest.fail(why)
        pytest.skip(f"SKIP: {why}")
    return lib


def missing_engine_fns(lib) -> list[str]:
    return [f for f in ENGINE_FNS if not lib.has(f)]


@pytest.fixture(scope="session")
def engine_lib(lib):
    """The library, which must export every engine function (else the test fails naming
    the missing ones)."""
    miss = missing_engine_fns(lib)
    if miss:
        pytest.fail(f"libpegaflow lacks {len(miss)} engine client functions: {', '.join(miss)}")
    return lib


def pf_bin() -> str | None:
    return os.environ.get("PF_BIN") or None


_TOKEN_FILE: str | None = None


def cluster_token_file() -> str:
    """The cluster token file of this run: PF_CLUSTER_TOKEN_FILE when the caller made one,
    else a random token written once per pytest process (0600); PEGAFLOW_TOKEN_FILE is set
    to it so the clients of this process send it."""
    global _TOKEN_FILE
    if _TOKEN_FILE is None:
        f = os.environ.get("PF_CLUSTER_TOKEN_FILE")
        if not f:
            import secrets
            import tempfile
            d = tempfile.mkdtemp(prefix="pf-token.")
            f = os.path.join(d, "cluster-token")
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
            os.environ["PF_CLUSTER_TOKEN_FILE"] = f
        os.environ["PEGAFLOW_TOKEN_FILE"] = f
        _TOKEN_FILE = f
    return _TOKEN_FILE


class ServerProc:
    """A pegaflow-server on loopback with ports chosen by the kernel; with ``netns``, in
    that network namespace (``ip netns exec``, which execs the server: same pid), its
    HTTP listener on ``host`` too."""

    def __init__(self, log_path: str, extra_args: tuple[str, ...] = (), port: int = 0,
                 host: str = "127.0.0.1", netns: str | None = None):
        b = pf_bin()
        self.log_path = log_path
        self.host = host
        self.netns = netns
        self.http_host = host if netns else "127.0.0.1"
        self.args = [os.path.join(b, "pegaflow-server"), "--gpu-backend", "sim",
                     "--pool-size", "256mb", "--addr", f"{host}:{port}",
                     "--http-addr", f"{self.http_host}:0", *extra_args]
        if netns or "--metaserver-addr" in extra_args:
            self.args += ["--cluster-token-file", cluster_token_file()]
        # a fault plan for every server of the run (docs/development.md "Finding races"),
        # e.g. PF_TEST_SERVER_FAULTS=engine.seal:delay=50 seals every Save's blocks 50 ms
        # late: a test that expects them queryable when the Save returns fails at once
        faults = os.environ.get("PF_TEST_SERVER_FAULTS")
        if faults and "--fault-spec" not in extra_args:
            if "--enable-debug" not in extra_args:
                self.args.append("--enable-debug")
            self.args += ["--fault-spec", faults]
        if netns:
            self.args = ["ip", "netns", "exec", netns, *self.args]
        self.proc = None
        self.port = None

    def start(self, timeout_s: float = 20.0) -> "ServerProc":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        pat = re.compile(rb"gRPC listening on \S+ \(port (\d+)\)")
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                m = pat.findall(f.read())
            if m:
                self.port = int(m[-1])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"pegaflow-server exited with {self.proc.returncode}; "
                                   f"log:\n{self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"pegaflow-server did not report its port; log:\n{self.log()}")

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None


@pytest.fixture
def server_factory(tmp_path, engine_lib):
    """Starts real servers; skips when PF_BIN is unset or the library lacks the engine."""
    yield from _servers(tmp_path)


@pytest.fixture
def plain_server_factory(tmp_path, lib):
    """Starts real servers for tests that need only connect/health/shutdown."""
    yield from _servers(tmp_path)


def netns_spaces() -> list[tuple[str, str]]:
    """PF_TEST_NETNS as [(namespace, address), ...] (empty when unset)."""
    out = []
    items = (x.strip() for x in os.environ.get("PF_TEST_NETNS", "").split(","))
    for item in filter(None, items):
        ns, sep, ip = item.partition("=")
        if not sep or not ns or not ip:
            raise ValueError(f"PF_TEST_NETNS: expected NS=IP, got {item!r}")
        out.append((ns, ip))
    return out


def _servers(tmp_path):
    if not pf_bin():
        pytest.skip("SKIP: PF_BIN is unset (run through `make test`): no pegaflow-server")
    started: list[ServerProc] = []
    spaces = netns_spaces()

    def start(name: str = "server", port: int = 0, extra_args: tuple[str, ...] = (),
              host: str = "127.0.0.1") -> ServerProc:
        ns = None
        if spaces:  # the k-th server of this test in the k-th namespace
            ns, host = spaces[len(started) % len(spaces)]
        s = ServerProc(str(tmp_path / f"{name}.log"), extra_args=tuple(extra_args), port=port,
                       host=host, netns=ns)
        started.append(s)
        return s.start()

    yield start
    for s in started:
        s.stop()


def require_engine_server(client, instance_probe: str = "pf-probe") -> None:
    """Fails when the server answers the engine RPCs with UNIMPLEMENTED."""
    from pegaflow.client.errors import Unimplemented

    try:
        client.query_raw(instance_probe, "probe", [b"\0" * 32])
    except Unimplemented as e:
        pytest.fail(f"pegaflow-server does not serve QueryPrefetch ({e.message})")
    except Exception:
        pass  # FAILED_PRECONDITION (unknown instance) etc.: implemented
