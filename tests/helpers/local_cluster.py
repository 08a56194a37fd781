"""A real multi-node Ray cluster on 127.0.0.1 for tests, in its own process.

    python local_cluster.py WORKERS

Starts a head node (with the dashboard and job server on 127.0.0.1) and WORKERS worker
nodes of one CPU each, prints one JSON line {"gcs": ..., "dashboard": ..., "workers": N},
then reads commands on stdin: `remove-worker` removes one worker node (answers
`removed`), end of input shuts every node of this cluster down (and nothing else).
"""

from __future__ import annotations

import json
import socket
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    from ray.cluster_utils import Cluster

    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    port = free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": port,
            "node_ip_address": "127.0.0.1",
            "dashboard_agent_listen_port": free_port(),  # not Ray's default 52365: another Ray may hold it
        },
    )
    nodes = [
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", dashboard_agent_listen_port=free_port())
        for _ in range(workers)
    ]
    cluster.wait_for_nodes()
    print(json.dumps({"gcs": cluster.address, "dashboard": f"http://127.0.0.1:{port}", "workers": workers}), flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "remove-worker" and nodes:
                cluster.remove_node(nodes.pop(), allow_graceful=False)
                print("removed", flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
