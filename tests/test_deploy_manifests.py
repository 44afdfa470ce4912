"""examples/deploy: the Kubernetes manifests and systemd units are valid and agree.

Kubernetes: every document is checked against the Kubernetes API schemas
that the kubernetes-validate package carries (offline: nothing is
downloaded), strictly (an unknown field is an error). Then the values that
must agree with forkserve and with each other are checked: the grace
period covers preStop and --graceful-timeout, the probes use the ports the
server binds, each pod's shard and the per-shard Services match the
replicas and the nginx upstreams.

systemd: `systemd-analyze verify` (when installed) with the units in a
temporary directory and ExecStart pointing at this forkserve; the stop
timeout covers the graceful timeout.
"""

import pathlib
import re
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from forkserve.store.shards import split_clients_block

DEPLOY = pathlib.Path(__file__).resolve().parent.parent / "examples" / "deploy"
MANIFEST = DEPLOY / "kubernetes" / "persondb.yaml"
#: apps.kubernetes.io/pod-index, which each pod reads its shard from, is set since 1.28
KUBERNETES_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]


def documents():
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def statefulset():
    [found] = [doc for doc in documents() if doc["kind"] == "StatefulSet"]
    return found


def container():
    [found] = statefulset()["spec"]["template"]["spec"]["containers"]
    return found


def options(command):
    """--name=value arguments of the container's command, as a dict."""
    return dict(arg[2:].split("=", 1) for arg in command if arg.startswith("--") and "=" in arg)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version):
    kinds = []
    for doc in documents():
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any error
        kinds.append(doc["kind"])
    assert kinds == ["StatefulSet", "Service", "Service", "Service", "Service"]


def test_an_invalid_manifest_is_caught():
    broken = statefulset()
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_grace_period_covers_prestop_and_the_graceful_timeout():
    spec = statefulset()["spec"]["template"]["spec"]
    command = container()["command"]
    assert command[0] == "forkserve"
    graceful = float(options(command)["graceful-timeout"])
    pre_stop = container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert spec["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + graceful + 1


def test_probes_use_the_ports_forkserve_binds():
    found = container()
    ports = {port["name"]: port["containerPort"] for port in found["ports"]}
    bound = options(found["command"])
    assert bound["bind"] == f"0.0.0.0:{ports['http']}"
    assert bound["stats"] == f"0.0.0.0:{ports['stats']}"
    assert found["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # forkserve's own answers, on the stats port
    assert found["readinessProbe"]["httpGet"] == {"path": "/health", "port": "stats"}
    assert found["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "stats"}
    # Loading may take minutes; liveness only starts once the startup probe passed.
    startup = found["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_each_pod_serves_its_shard_and_each_shard_has_a_service():
    replicas = statefulset()["spec"]["replicas"]
    env = {item["name"]: item for item in container()["env"]}
    assert env["PERSONDB_SHARD"]["value"] == f"$(POD_INDEX)/{replicas}"
    assert env["PERSONDB_STORE"]["value"].endswith(f".shard$(POD_INDEX)-of-{replicas}.store")
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    services = {doc["metadata"]["name"]: doc for doc in documents() if doc["kind"] == "Service"}
    for shard in range(replicas):
        selector = services[f"persondb-shard{shard}"]["spec"]["selector"]
        assert selector == {"app": "persondb", "apps.kubernetes.io/pod-index": str(shard)}
    nginx = (DEPLOY / "nginx.conf").read_text()
    assert split_clients_block(replicas) in nginx
    assert len(re.findall(r"^upstream shard\d+ \{", nginx, re.MULTILINE)) == replicas


def test_memory_limit_leaves_room_for_a_reload():
    resources = container()["resources"]
    units = {"Mi": 2**20, "Gi": 2**30}

    def size(text):
        return int(text[:-2]) * units[text[-2:]]
    # During a HUP the old and the new generation both run: the limit must
    # hold two generations' private memory on top of the shared pages.
    assert size(resources["limits"]["memory"]) >= 2 * size(resources["requests"]["memory"])


# -- systemd ------------------------------------------------------------------------

def unit(name):
    values = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_systemd_stop_timeout_covers_the_graceful_timeout():
    service = unit("forkserve@.service")
    environment = dict(item.split("=", 1) for item in service["Environment"])
    graceful = float(environment["FORKSERVE_GRACEFUL_TIMEOUT"])
    assert float(service["TimeoutStopSec"][0]) >= graceful + 1
    assert service["KillMode"] == ["mixed"]  # TERM to the master only: it drains the workers
    assert service["Type"] == ["notify"] and service["NotifyAccess"] == ["main"]
    assert environment["PERSONDB_SHARD"] == "%i/3"
    target = unit("forkserve.target")
    assert target["Wants"] == [" ".join(f"forkserve@{n}.service" for n in range(3))]


def test_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    forkserve = pathlib.Path(sys.executable).with_name("forkserve")
    for name in ("forkserve@.service", "forkserve.target"):
        text = (DEPLOY / "systemd" / name).read_text()
        text = text.replace("/opt/persondb/venv/bin/forkserve", str(forkserve))
        text = re.sub(r"^(User|Group)=.*$", r"\1=root", text, flags=re.MULTILINE)
        (tmp_path / name).write_text(text)
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(tmp_path / "forkserve@0.service"),
         str(tmp_path / "forkserve.target")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    # Unknown keys and values that do not parse are only warnings: fail on them too.
    problems = [line for line in result.stderr.splitlines()
                if "forkserve@.service" in line or "forkserve.target" in line]
    assert not problems, result.stderr
