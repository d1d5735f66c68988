"""pegaflow-sim's own protection (docs/security.md "Files and units", "Defaults"): the state
directory (its state.json names processes and namespaces a later run kills and removes) is
used only when this user owns it, it is not a symlink and nobody else may write it; each run
makes a random cluster token (0600) that the MetaServer, the servers and the simulator's own
clients (PEGAFLOW_TOKEN_FILE) use (that the nodes get it is proven end to end by
tests/integration/test_sim.sh: a P2P node without it refuses to start)."""

from __future__ import annotations

import os
import stat

import pytest

from pegaflow.sim import cluster as cl


def test_state_dir_owned_and_private_is_accepted(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    cl.check_state_dir(str(d))


def test_state_dir_writable_by_others_is_refused(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(SystemExit, match="writable by others"):
        cl.check_state_dir(str(d))
    os.chmod(d, 0o720)
    with pytest.raises(SystemExit, match="writable by others"):
        cl.check_state_dir(str(d))


def test_state_dir_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(SystemExit, match="not a directory"):
        cl.check_state_dir(str(link))


@pytest.mark.skipif(os.geteuid() != 0, reason="SKIP: chown to another user needs root")
def test_state_dir_of_another_user_is_refused(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)  # nobody
    with pytest.raises(SystemExit, match="belongs to uid 65534"):
        cl.check_state_dir(str(d))


def test_clean_stale_refuses_a_foreign_state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    d.mkdir()
    os.chmod(d, 0o777)
    (d / "state.json").write_text('{"pid": 1, "namespaces": ["victim"]}')
    monkeypatch.setattr(cl, "state_path", lambda: str(d / "state.json"))
    with pytest.raises(SystemExit, match="writable by others"):
        cl.clean_stale(print)
    assert (d / "state.json").exists()  # nothing acted upon


def test_token_per_run(tmp_path, monkeypatch):
    monkeypatch.delenv("PEGAFLOW_TOKEN_FILE", raising=False)
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    fa, fb = cl.write_token(str(a)), cl.write_token(str(b))
    assert os.environ["PEGAFLOW_TOKEN_FILE"] == fb
    ta, tb = open(fa).read().strip(), open(fb).read().strip()
    assert len(ta) == 64 and int(ta, 16) >= 0 and ta != tb
    assert stat.S_IMODE(os.stat(fa).st_mode) == 0o600
    with pytest.raises(FileExistsError):  # never overwrites (O_EXCL)
        cl.write_token(str(a))

