"""The deployment files, checked offline: the Kubernetes manifests in deploy/kubernetes/ against
the Kubernetes schemas (kubernetes-validate, strict) and against what the service needs (a GPU,
its probes, its settings, a shared volume, the autoscaler's metric), and the `scale` profile of
docker-compose.yml against deploy/nginx/pencil.conf."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the deployment files")

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "kubernetes"
COMPOSE_FILE = ROOT / "docker-compose.yml"
NGINX_CONF = ROOT / "deploy" / "nginx" / "pencil.conf"

# Kubernetes version the manifests are validated against (.ci/docker-lint.sh uses the same).
K8S_VERSION = "1.31"
NOT_MANIFESTS = {"kustomization.yaml", "prometheus-adapter-values.yaml"}
MANIFEST_FILES = sorted(p for p in K8S_DIR.glob("*.yaml") if p.name not in NOT_MANIFESTS)

PORT = 8000
SCALE_SERVICES = {"postgres", "pencil-a", "pencil-b", "proxy"}
REPLICAS = ("pencil-a", "pencil-b")
# Settings the replicas need that may not be in app.config yet (the PostgreSQL work adds them).
REPLICA_SETTINGS = {"PENCIL_DATABASE_URL", "PENCIL_JOB_LEASE_S", "PENCIL_REPLICA_ID"}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifests() -> list[dict[str, Any]]:
    return [doc for path in MANIFEST_FILES for doc in load_all(path)]


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name!r} in deploy/kubernetes, found {len(matches)}"
    return matches[0]


def server_container() -> dict[str, Any]:
    containers = find("Deployment", "pencil-gpu")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "pencil-gpu")


@pytest.fixture(scope="module")
def kubernetes_validate():
    return pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate is not installed (pip install kubernetes-validate): no schema checks",
    )


# ------------------------------------------------------------------------ Kubernetes ---


def test_manifest_folder_is_complete():
    names = {p.name for p in MANIFEST_FILES}
    assert {"deployment.yaml", "service.yaml", "pvc.yaml", "postgres.yaml", "hpa.yaml", "secret.yaml"} <= names


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.name)
def test_manifest_matches_kubernetes_schema(kubernetes_validate, path: Path):
    docs = load_all(path)
    assert docs, f"{path.name} holds no object"
    errors = []  # collected, so that a failure shows the message rather than the whole schema
    for doc in docs:
        where = f"{path.name}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {'.'.join(str(part) for part in exc.path)}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{where}: {exc.message}")
        if "namespace" in doc["metadata"]:
            errors.append(f"{where}: names a namespace (it is chosen with kubectl -n)")
    assert not errors, "\n".join(errors)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a file is listed twice"
    assert set(listed) == {p.name for p in MANIFEST_FILES}
    assert "prometheus-adapter-values.yaml" not in listed  # Helm values, not a manifest
    assert "namespace" not in kustomization


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds():
    built = subprocess.run(
        ["kubectl", "kustomize", str(K8S_DIR)], capture_output=True, text=True, timeout=60, check=False
    )
    assert built.returncode == 0, built.stderr
    kinds = sorted(doc["kind"] for doc in yaml.safe_load_all(built.stdout) if doc)
    assert kinds == sorted(m["kind"] for m in manifests())


def test_deployment_gets_a_gpu_per_pod():
    resources = server_container()["resources"]
    assert int(resources["requests"]["nvidia.com/gpu"]) == 1
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
    assert {"cpu", "memory"} <= set(resources["requests"])


def test_probes_point_at_the_service():
    container = server_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert PORT in ports.values()

    def target(probe: str) -> tuple[str, int]:
        http = container[probe]["httpGet"]
        port = http["port"]
        return http["path"], ports[port] if isinstance(port, str) else port

    assert target("readinessProbe") == ("/readyz", PORT)
    assert target("livenessProbe") == ("/healthz", PORT)
    assert target("startupProbe") == ("/healthz", PORT)
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "start-up compiles kernels: be generous"


def test_deployment_runs_as_the_image_user_and_stops_gracefully():
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid, gid = re.search(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE).groups()
    pod = find("Deployment", "pencil-gpu")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(uid), int(gid))
    # The server takes up to ~20 s after SIGTERM (app/serve.py STOP_WAIT_S), after the preStop sleep.
    assert pod["terminationGracePeriodSeconds"] >= 30


def test_deployment_environment():
    container = server_container()
    env = {e["name"]: e for e in container["env"]}
    config = find("ConfigMap", container["envFrom"][0]["configMapRef"]["name"])["data"]
    secret = find("Secret", "pencil-secrets")
    names = set(env) | set(config)

    assert {"PENCIL_DATABASE_URL", "PENCIL_DATA_DIR", "PENCIL_ADMIN_TOKEN"} <= names
    assert config["PENCIL_DATA_DIR"] == "/data"
    for name in ("PENCIL_ADMIN_TOKEN", "PENCIL_DATABASE_URL"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "pencil-secrets"
        assert ref["key"] in secret["stringData"], f"{name}: no key {ref['key']!r} in the Secret"
    assert all(isinstance(value, str) for value in config.values()), "ConfigMap values must be strings"
    assert int(config["PENCIL_PROCESSES"]) >= 1, "0 (auto) would count the node's cores, not the pod's"


def test_secret_database_url_matches_bundled_postgres():
    secret = find("Secret", "pencil-secrets")["stringData"]
    url = re.fullmatch(r"postgresql://(\w+):([^@]+)@([\w.-]+):(\d+)/(\w+)", secret["database-url"])
    assert url, secret["database-url"]
    user, password, host, port, database = url.groups()
    statefulset = find("StatefulSet", "postgres")
    env = {e["name"]: e for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (user, database) == (env["POSTGRES_USER"]["value"], env["POSTGRES_DB"]["value"])
    assert password == secret["postgres-password"]
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "postgres-password"
    service = find("Service", host)
    assert service["spec"]["clusterIP"] == "None"  # headless, for the StatefulSet
    assert statefulset["spec"]["serviceName"] == host
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    probe = statefulset["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["exec"]["command"][0] == "pg_isready"


def test_data_volume_is_shared():
    pod = find("Deployment", "pencil-gpu")["spec"]["template"]["spec"]
    mount = next(m for m in server_container()["volumeMounts"] if m["mountPath"] == "/data")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_service_pdb_and_hpa_select_the_deployment():
    deployment = find("Deployment", "pencil-gpu")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()

    service = find("Service", "pencil-gpu")
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == 80
    assert port["targetPort"] in (PORT, *(p["name"] for p in server_container()["ports"] if p["containerPort"] == PORT))

    pdb = find("PodDisruptionBudget", "pencil-gpu")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    hpa = find("HorizontalPodAutoscaler", "pencil-gpu")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "pencil-gpu"}
    assert hpa["spec"]["minReplicas"] <= deployment["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]

    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == PORT


def test_hpa_metric_is_served_by_the_adapter_rule():
    hpa = find("HorizontalPodAutoscaler", "pencil-gpu")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["target"]["type"] == "AverageValue"
    assert "scaleDown" in hpa["spec"]["behavior"]

    values = yaml.safe_load((K8S_DIR / "prometheus-adapter-values.yaml").read_text())
    rules = {rule["name"]["as"]: rule for rule in values["rules"]["external"]}
    rule = rules[metric["external"]["metric"]["name"]]
    assert re.search(rule["name"]["matches"], "pencil_jobs")
    assert "pencil_jobs" in rule["seriesQuery"] and 'status="queued"' in rule["seriesQuery"]
    # Every pod reports the cluster-wide count: max over the pods, never a sum over them.
    query = rule["metricsQuery"]
    assert query.startswith("max(") and 'status="queued"' in query and "<<.LabelMatchers>>" in query


# --------------------------------------------------------------- compose and nginx ---


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def nginx_upstreams() -> dict[str, list[tuple[str, int]]]:
    """upstream name -> its servers (host, port), from deploy/nginx/pencil.conf."""
    text = re.sub(r"#.*", "", NGINX_CONF.read_text())
    upstreams = {}
    for name, body in re.findall(r"\bupstream\s+(\S+)\s*\{([^}]*)\}", text):
        servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", body, re.MULTILINE)
        upstreams[name] = [(host, int(port)) for host, port in servers]
    return upstreams


def test_compose_scale_profile():
    services = compose()["services"]
    assert "profiles" not in services["pencil"], "the default service stays outside the profiles"
    assert SCALE_SERVICES <= set(services)
    for name in SCALE_SERVICES:
        assert services[name].get("profiles") == ["scale"], name

    url_pattern = r"postgresql://(\w+):\$\{PENCIL_POSTGRES_PASSWORD:-\w+\}@([\w-]+):5432/(\w+)"
    postgres_env = services["postgres"]["environment"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    devices, replica_ids, data_volumes = set(), set(), set()
    for name in REPLICAS:
        service = services[name]
        assert service["image"] == services["pencil"]["image"]
        env = service["environment"]
        user, host, database = re.fullmatch(url_pattern, env["PENCIL_DATABASE_URL"]).groups()
        assert host == "postgres" and host in services
        assert (user, database) == (postgres_env["POSTGRES_USER"], postgres_env["POSTGRES_DB"])
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert env["PENCIL_DATA_DIR"] == "/data"
        replica_ids.add(env["PENCIL_REPLICA_ID"])
        (mount,) = [v for v in service["volumes"] if v.split(":")[1] == "/data"]
        data_volumes.add(mount.split(":")[0])
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        devices.add(tuple(device["device_ids"]))
    assert len(replica_ids) == len(REPLICAS), "each replica needs its own PENCIL_REPLICA_ID"
    assert len(devices) == len(REPLICAS), "each replica reserves its own GPU"
    (shared,) = data_volumes
    assert shared in compose()["volumes"], "/data of the replicas must be one named volume"
    assert shared not in {v.split(":")[0] for v in services["pencil"]["volumes"]}


def test_nginx_upstream_is_the_compose_replicas():
    services = compose()["services"]
    upstreams = nginx_upstreams()
    (name,) = upstreams
    assert sorted(host for host, _ in upstreams[name]) == sorted(REPLICAS)
    assert {port for _, port in upstreams[name]} == {PORT}
    text = NGINX_CONF.read_text()
    assert set(re.findall(r"proxy_pass\s+http://([\w.-]+)\s*;", text)) == {name}

    proxy = services["proxy"]
    assert set(proxy["depends_on"]) == set(REPLICAS)
    (mount,) = proxy["volumes"]
    source, target = mount.split(":")[:2]
    assert (ROOT / source).resolve() == NGINX_CONF
    assert target.startswith("/etc/nginx/conf.d/")


def test_nginx_settings():
    text = re.sub(r"#.*", "", NGINX_CONF.read_text())
    sizes = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    limits = [int(n) * sizes[u.lower()] for n, u in re.findall(r"client_max_body_size\s+(\d+)([kmgKMG])\s*;", text)]
    assert limits and min(limits) >= 512 << 20, "job uploads go up to 512 MiB"
    assert re.search(r"proxy_request_buffering\s+off\s*;", text)
    assert int(re.search(r"proxy_read_timeout\s+(\d+)s\s*;", text).group(1)) >= 60
    assert re.search(r"least_conn\s*;", text) and re.search(r"keepalive\s+\d+\s*;", text)
    assert re.search(r"proxy_set_header\s+X-Request-ID\s", text)
    assert re.search(r"proxy_set_header\s+X-Forwarded-For\s", text)
    next_upstream = re.search(r"proxy_next_upstream\s+([^;]*);", text).group(1).split()
    assert "http_503" in next_upstream
    assert "non_idempotent" not in next_upstream, "a POST (a render, a new job) must never be sent twice"


# ------------------------------------------------------------------------- settings ---


def test_every_setting_is_one_the_app_reads():
    """A misspelt PENCIL_* variable is silently ignored by the app: catch it here."""
    config = pytest.importorskip("app.config", reason="app.config (pydantic-settings) is needed for the settings")
    known = {f"PENCIL_{name.upper()}" for name in config.Settings.model_fields} | REPLICA_SETTINGS
    container = server_container()
    used = {"deploy/kubernetes": {e["name"] for e in container["env"]}}
    for source in container["envFrom"]:
        used["deploy/kubernetes"] |= set(find("ConfigMap", source["configMapRef"]["name"])["data"])
    services = compose()["services"]
    for name in ("pencil", *REPLICAS):
        used[f"docker-compose.yml {name}"] = set(services[name]["environment"])
    for where, names in used.items():
        unknown = {n for n in names if n.startswith("PENCIL_")} - known
        assert not unknown, f"{where}: settings the app does not read: {sorted(unknown)}"


# ------------------------------------------------------------------ CPU-only hosts ---

CPU_OVERRIDE = ROOT / "docker-compose.cpu.yml"


class Reset:
    """Compose's `!reset` tag: the merged file drops the base file's value."""


def _compose_loader() -> type:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!reset", lambda loader, node: Reset())
    return Loader


def test_the_cpu_override_drops_the_gpu_reservation_and_picks_the_cpu():
    """`docker compose -f docker-compose.yml -f docker-compose.cpu.yml up` on a host without
    the NVIDIA toolkit: the `pencil` service without `deploy:` (its GPU reservation), on the CPU
    backend; nothing else changed."""
    override = yaml.load(CPU_OVERRIDE.read_text(), Loader=_compose_loader())
    assert set(override) == {"services"} and set(override["services"]) == {"pencil"}
    pencil = override["services"]["pencil"]
    assert isinstance(pencil["deploy"], Reset)
    assert compose()["services"]["pencil"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert pencil["environment"]["PENCIL_BACKEND"] == "cpu"
    config = pytest.importorskip("app.config", reason="app.config (pydantic-settings) is needed for the settings")
    known = {f"PENCIL_{name.upper()}" for name in config.Settings.model_fields}
    assert set(pencil["environment"]) <= known
    readme = (ROOT / "README.md").read_text()
    assert "docker compose -f docker-compose.yml -f docker-compose.cpu.yml up" in readme
