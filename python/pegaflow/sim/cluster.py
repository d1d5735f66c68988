"""The cluster's processes, network and files, and their removal.

Topology (root with iproute2): a hub namespace ``pfsim-hub`` holding a bridge, and one
namespace per member (``pfsim-ms`` for the MetaServer, ``pfsim-n1``...) joined to it by a
veth pair (``pfs-<tag>`` inside, ``pfh-<tag>`` on the bridge), addresses 10.78.0.0/24 that
exist only inside these namespaces. Without root (or with --loopback): the MetaServer on
127.0.0.1 and node k on 127.0.0.(k+1), which the P2P address check accepts on one host.

Everything created is recorded, as it is created, in a state file (``/run/pegaflow-sim/
state.json`` as root, else ``$XDG_RUNTIME_DIR`` or ``/tmp/pegaflow-sim-<uid>/``): the
simulator's pid and start time, each child's pid and start time, the namespaces, the
temporary directory and the sim KV shared-memory objects of the node processes. A normal
exit, Ctrl-C, SIGTERM or a crashed child removes all of it (teardown); after a kill -9
of the simulator itself the next run finds the state file of a dead owner and removes
what it lists (children also get SIGKILL from the kernel when the simulator dies:
PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import re
import shutil
import secrets
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

NS_PREFIX = "pfsim-"
SUBNET = "10.78.0"


def state_path() -> str:
    if os.geteuid() == 0:
        d = "/run/pegaflow-sim"
    else:
        base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
        d = os.path.join(base, f"pegaflow-sim-{os.getuid()}")
    return os.path.join(d, "state.json")


def proc_start(pid: int) -> int | None:
    """Start time of pid (clock ticks since boot), None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, start: int | None) -> bool:
    """pid is the process that started at ``start`` and has not exited (a zombie has)."""
    if start is None or proc_start(pid) != start:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def netns_possible() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not root"
    if not shutil.which("ip"):
        return False, "iproute2 (ip) is not installed"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"ip netns does not work: {r.stderr.strip()}"
    return True, ""


@dataclass
class Proc:
    what: str  # "metaserver", "server n2", "node n2"
    popen: subprocess.Popen
    log: str
    start: int | None
    expected_exit: bool = False


@dataclass
class Member:
    tag: str  # "ms", "n1", ...
    ns: str | None
    ip: str
    nic: str  # --nics value


@dataclass
class Cluster:
    mode: str  # "netns" | "loopback"
    tmpdir: str
    state_file: str
    members: dict[str, Member] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    shm_pids: list[list] = field(default_factory=list)  # [pid, time.time() before spawn]
    ssd_dir: str | None = None  # where the SSD files go when tmpdir refuses O_DIRECT
    keep_logs: str | None = None
    token_file: str | None = None  # the run's cluster token (write_token)

    # ------------------------------------------------------------ state file

    def save_state(self) -> None:
        st = {"pid": os.getpid(), "start": proc_start(os.getpid()), "mode": self.mode,
              "tmpdir": self.tmpdir, "ssd_dir": self.ssd_dir, "namespaces": self.namespaces,
              "procs": [{"pid": p.popen.pid, "start": p.start, "what": p.what}
                        for p in self.procs],
              "shm_pids": self.shm_pids}
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f)
        os.replace(tmp, self.state_file)

    # ------------------------------------------------------------ network

    def _ip(self, *args: str) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def _add_ns(self, name: str) -> None:
        self._ip("netns", "add", name)
        self.namespaces.append(name)
        self.save_state()

    def setup_network(self, nodes: int) -> None:
        if self.mode == "loopback":
            self.members["ms"] = Member("ms", None, "127.0.0.1", "127.0.0.1")
            for k in range(1, nodes + 1):
                ip = f"127.0.0.{k + 1}"
                self.members[f"n{k}"] = Member(f"n{k}", None, ip, ip)
            return
        hub = NS_PREFIX + "hub"
        self._add_ns(hub)
        self._ip("-n", hub, "link", "add", "pfsim-br", "type", "bridge")
        self._ip("-n", hub, "link", "set", "pfsim-br", "up")
        tags = ["ms"] + [f"n{k}" for k in range(1, nodes + 1)]
        for i, tag in enumerate(tags):
            ns, ip = NS_PREFIX + tag, f"{SUBNET}.{10 if tag == 'ms' else 10 + i}"
            self._add_ns(ns)
            inner, outer = f"pfs-{tag}", f"pfh-{tag}"
            self._ip("link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer,
                     "netns", hub)
            self._ip("-n", ns, "addr", "add", f"{ip}/24", "dev", inner)
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "link", "set", inner, "up")
            self._ip("-n", hub, "link", "set", outer, "master", "pfsim-br")
            self._ip("-n", hub, "link", "set", outer, "up")
            self.members[tag] = Member(tag, ns, ip, inner)

    # ------------------------------------------------------------ processes

    def ssd_path(self, name: str) -> str:
        """A path for an SSD cache file: in tmpdir when its file system takes O_DIRECT (the
        server refuses buffered I/O), else in a directory of its own under /var/tmp."""
        if self.ssd_dir is None:
            self.ssd_dir = self.tmpdir
            if not _odirect_ok(self.tmpdir):
                self.ssd_dir = tempfile.mkdtemp(prefix="pegaflow-sim-", dir="/var/tmp")
                self.save_state()
        return os.path.join(self.ssd_dir, name)

    def log_path(self, what: str) -> str:
        return os.path.join(self.tmpdir, what.replace(" ", "-") + ".log")

    def spawn(self, what: str, member: Member, argv: list[str], *, stdin=None, stdout=None,
              env: dict | None = None) -> Proc:
        log = self.log_path(what)
        logf = open(log, "ab")
        full = (["ip", "netns", "exec", member.ns] if member.ns else []) + argv
        p = subprocess.Popen(full, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                             stdout=stdout if stdout is not None else logf, stderr=logf,
                             env=env, preexec_fn=_pdeathsig, start_new_session=True)
        logf.close()
        proc = Proc(what, p, log, proc_start(p.pid))
        self.procs.append(proc)
        self.save_state()
        return proc

    def wait_log(self, proc: Proc, pattern: str, timeout_s: float = 30.0,
                 start_at: int = 0) -> re.Match:
        """Waits until proc's log (from byte start_at) matches pattern; raises with the log
        when the process exits or the deadline passes."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            with open(proc.log, "rb") as f:
                f.seek(start_at)
                m = rx.search(f.read().decode(errors="replace"))
            if m:
                return m
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.what} exited with {proc.popen.returncode} before "
                                   f"/{pattern}/; log {proc.log}:\n{tail(proc.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{proc.what}: no /{pattern}/ after {timeout_s:.0f} s; "
                                   f"log {proc.log}:\n{tail(proc.log)}")
            time.sleep(0.02)

    def kill(self, proc: Proc, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int | None:
        proc.expected_exit = True
        if proc.popen.poll() is None:
            try:
                os.killpg(proc.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
        return proc.popen.returncode

    def crashed(self) -> Proc | None:
        for p in self.procs:
            if not p.expected_exit and p.popen.poll() is not None:
                return p
        return None

    # ------------------------------------------------------------ teardown

    def teardown(self) -> list[str]:
        """Removes everything; returns, with the tail of their logs, the processes that
        did not exit cleanly on SIGTERM (a sanitizer report, a shutdown bug)."""
        unclean = []
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                rc = self.kill(p, signal.SIGTERM, timeout_s=10.0)
                if rc != 0:
                    unclean.append(f"{p.what} exited with {rc} on SIGTERM; log:\n"
                                   f"{tail(p.log)}")
        remove_shm(self.shm_pids)
        for ns in reversed(self.namespaces):
            _kill_ns_pids(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.namespaces = []
        if self.keep_logs:
            os.makedirs(self.keep_logs, exist_ok=True)
            for f in glob.glob(os.path.join(self.tmpdir, "*.log")):
                shutil.copy(f, self.keep_logs)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self.ssd_dir and self.ssd_dir != self.tmpdir:
            shutil.rmtree(self.ssd_dir, ignore_errors=True)
        _remove_state(self.state_file)
        return unclean


def _remove_state(path: str) -> None:
    """The state file and its directory (when nothing else is in it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def _odirect_ok(d: str) -> bool:
    probe = os.path.join(d, ".odirect-probe")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | getattr(os, "O_DIRECT", 0), 0o600)
        os.close(fd)
        return True
    except OSError:
        return False
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass


def tail(path: str, n: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def owned_shm(owners: list[list]) -> list[str]:
    """The sim KV caches (pf_simkv_<pid>_*, libpegaflow's naming) that the node processes
    ``owners`` ([pid, time the process was started]) made: objects of an earlier process
    with the same pid are older and not ours."""
    out = []
    for pid, since in owners:
        for f in glob.glob(f"/dev/shm/pf_simkv_{int(pid)}_*"):
            try:
                if os.stat(f).st_mtime >= since - 1.0:
                    out.append(f)
            except OSError:
                pass
    return out


def remove_shm(owners: list[list]) -> int:
    n = 0
    for f in owned_shm(owners):
        try:
            os.unlink(f)
            n += 1
        except OSError:
            pass
    return n


def _kill_ns_pids(ns: str) -> int:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    n = 0
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
            n += 1
        except (ProcessLookupError, ValueError):
            pass
    return n


def clean_stale(say) -> None:
    """Removes what a previous run whose owner is dead left behind (see the module doc);
    raises when a live pegaflow-sim owns the state file."""
    path = state_path()
    if os.path.lexists(os.path.dirname(path)):
        check_state_dir(os.path.dirname(path))  # never act on a state file others planted
    st = None
    try:
        with open(path) as f:
            st = json.load(f)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        say(f"pegaflow-sim: unreadable state file {path} ({e}); removing it")
    if st is not None and _alive(int(st.get("pid", 0)), st.get("start")):
        raise RuntimeError(f"another pegaflow-sim (pid {st['pid']}) is running this cluster "
                           f"(state file {path}); stop it first (Ctrl-C or kill {st['pid']})")
    killed = nss = shm = 0
    tmpdir = None
    if st is not None:
        for p in st.get("procs", []):
            if _alive(int(p["pid"]), p.get("start")):
                try:
                    os.killpg(int(p["pid"]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed += 1
        shm = remove_shm(st.get("shm_pids", []))
        tmpdir = st.get("tmpdir")
        sd = st.get("ssd_dir")
        if sd and sd != tmpdir and os.path.basename(sd).startswith("pegaflow-sim-"):
            shutil.rmtree(sd, ignore_errors=True)
    names = set(st.get("namespaces", [])) if st else set()
    if os.geteuid() == 0 and shutil.which("ip"):
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        names |= {l.split()[0] for l in r.stdout.splitlines()
                  if l.split() and l.split()[0].startswith(NS_PREFIX)}
        for ns in sorted(names):
            killed += _kill_ns_pids(ns)
            if subprocess.run(["ip", "netns", "del", ns], capture_output=True).returncode == 0:
                nss += 1
    if tmpdir and os.path.basename(tmpdir).startswith("pegaflow-sim-") and os.path.isdir(tmpdir):
        shutil.rmtree(tmpdir, ignore_errors=True)
    else:
        tmpdir = None
    if st is not None or nss:
        say(f"pegaflow-sim: cleaned up after a previous run (pid {st.get('pid') if st else '?'}"
            f", no longer running): {killed} processes, {nss} namespaces, {shm} shared-memory "
            f"objects{', ' + tmpdir if tmpdir else ''}")
    _remove_state(path)


def check_state_dir(d: str) -> None:
    """Refuses (SystemExit, one line) a state directory this user does not own, a symlink,
    or one others may write: its state.json names processes and namespaces the next run
    kills and removes, so nobody else may be able to plant one (docs/security.md)."""
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise SystemExit(f"pegaflow-sim: state directory {d} is not a directory (a symlink?); "
                         f"remove it")
    if st.st_uid != os.geteuid():
        raise SystemExit(f"pegaflow-sim: state directory {d} belongs to uid {st.st_uid}, not "
                         f"to this user (uid {os.geteuid()}); remove it or set XDG_RUNTIME_DIR")
    if st.st_mode & 0o022:
        raise SystemExit(f"pegaflow-sim: state directory {d} is writable by others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); chmod 700 it")


def write_token(tmpdir: str) -> str:
    """A random cluster token for this run in tmpdir/cluster-token (0600): P2P nodes refuse
    to start without one (protected by default); the MetaServer, every server and this
    process's clients (PEGAFLOW_TOKEN_FILE) use it."""
    path = os.path.join(tmpdir, "cluster-token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.environ["PEGAFLOW_TOKEN_FILE"] = path
    return path


def new_cluster(mode: str, keep_logs: str | None) -> Cluster:
    sp = state_path()
    os.makedirs(os.path.dirname(sp), mode=0o700, exist_ok=True)
    check_state_dir(os.path.dirname(sp))
    tmpdir = tempfile.mkdtemp(prefix="pegaflow-sim-")
    c = Cluster(mode, tmpdir, sp, keep_logs=keep_logs)
    c.token_file = write_token(tmpdir)
    c.save_state()
    return c
