"""The defaults expose nothing beyond the machine: every server of the embedded Ray binds
to loopback, and the auth mode is set explicitly."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from conftest import descendants
from sweep.orchestrate.ray.env import is_loopback, ray_environment
from sweep.config import compose


def listening_sockets(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every TCP socket in LISTEN state owned by ``pids``."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in (Path("/proc") / str(pid) / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            local, state, inode = parts[1], parts[3], parts[9]
            if state == "0A" and inode in inodes:
                found.append((inodes[inode], decode(local.split(":")[0], v6)))
    return found


def decode(hex_addr: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_addr)
    if not v6:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
    flat = b"".join(words)
    if flat[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in flat[12:])
    return flat.hex()


def test_every_embedded_ray_server_listens_on_loopback_only(ray_session):
    sockets = listening_sockets(set(descendants(os.getpid())) | {os.getpid()})
    assert len(sockets) >= 3, sockets  # GCS, raylet, workers...
    exposed = [(pid, addr) for pid, addr in sockets if not addr.startswith("127.")]
    assert exposed == [], exposed


def test_auth_mode_is_explicit(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    local = compose([]).cluster
    ray_environment(dataclasses.replace(local, address="10.0.0.5:6379", auth="disabled"))
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    ray_environment(local)
    assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_loopback_addresses():
    assert is_loopback(None) and is_loopback("127.0.0.1:6379") and is_loopback("http://localhost:8265")
    assert not is_loopback("10.1.2.3:6379") and not is_loopback("auto")
