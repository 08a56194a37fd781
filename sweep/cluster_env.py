"""The environment Ray must see when it is imported (it reads these variables then)."""

from __future__ import annotations

import os

from sweep.config import ClusterConfig

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback(address: str | None) -> bool:
    """An embedded Ray (None) or a cluster address on this machine's loopback."""
    if address is None:
        return True
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def ray_environment(cluster: ClusterConfig) -> None:
    """Set the auth mode explicitly, and for a Ray on loopback, Ray's single-machine mode.

    That mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the one Ray uses on macOS and
    Windows) makes every Ray server bind to 127.0.0.1 and clients connect over 127.0.0.1;
    otherwise Ray's gRPC servers listen on all interfaces and clients rewrite 127.0.0.1 to
    the machine's address. Ray reads both variables at import (``sweep.tune.start_ray``
    also sets the flag in an already imported Ray). Call before anything imports ``ray``.
    """
    os.environ["RAY_AUTH_MODE"] = cluster.auth
    if is_loopback(cluster.address):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
