"""examples/deploy/nginx.conf in front of three real PersonDB shards.

A real nginx (unix socket in tmp_path), three real forkserve instances on
127.0.0.1 port 0, each serving one shard (PERSONDB_SHARD=i/3, store mode),
real requests. Skipped with an install hint when nginx is missing, failed
instead when CI=true (.ci/run installs nginx).
"""

import json
import re
import subprocess
import urllib.parse

import pytest

from deploy_cluster import (
    DEPLOY, ROOT, SHARDS, Instance, Load, Nginx, emails_by_shard, require_nginx, rolling_reload,
    start_instances,
)
from forkserve.store.shards import shard_of, split_clients_block
from forkserve_testing import ServerProcess, poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROWS = 1500


@pytest.fixture(autouse=True)
def nginx_installed():
    require_nginx(pytest)


@pytest.fixture
def people(tmp_path):
    from examples.persondb import generate
    path = tmp_path / "people.csv"
    generate.generate_file(str(path), ROWS, 0)
    return path


@pytest.fixture
def cluster(tmp_path, people):
    """(nginx, instances): three shards behind nginx, all ready."""
    instances = []
    nginx = None
    try:
        instances.extend(start_instances(people, tmp_path))
        nginx = Nginx.for_shards(tmp_path, [instance.port for instance in instances]).start()
        yield nginx, instances
    finally:
        if nginx is not None:
            nginx.stop()
        for instance in instances:
            instance.kill_group()


def test_example_split_clients_block_is_the_one_forkserve_prints():
    text = (DEPLOY / "nginx.conf").read_text()
    block = re.search(r'^split_clients .*?^}\n', text, re.MULTILINE | re.DOTALL).group(0)
    assert block == split_clients_block(SHARDS)


def test_nginx_split_clients_places_every_key_where_shard_of_does(tmp_path):
    """nginx computes $shard for 1,000 keys; forkserve must agree on each."""
    def site(listen):
        return (split_clients_block(SHARDS) + split_clients_block(7, variable="$seven") +
                "server {\n" + "".join(f"  listen {address};\n" for address in listen) +
                '  location ~ ^/k/(?<shard_key>.+)$ { return 200 "$shard $seven"; }\n'
                "  location / { return 404; }\n}\n")
    nginx = Nginx(tmp_path, site)
    nginx.start()
    try:
        keys = ["a", "ab", "abc", "abcd", "ana@example.com", "zoë@example.com",
                "日本@example.jp"] + [f"person{n}.x{n * 7919 % 1000}@corp{n % 13}.example"
                                     for n in range(1000)]
        connection = nginx.connection()
        for key in keys:
            connection.request("GET", "/k/" + urllib.parse.quote(key, safe="@"))
            response = connection.getresponse()
            assert response.status == 200
            assert response.read().decode() == f"shard{shard_of(key, 3)} shard{shard_of(key, 7)}", key
        connection.close()
    finally:
        nginx.stop()


def test_every_person_is_served_through_nginx_by_the_shard_that_holds_it(cluster, people):
    nginx, instances = cluster
    groups = emails_by_shard(people, per_shard=60)
    for shard, emails in groups.items():
        for email in emails:
            status, headers, body = nginx.get(f"/person/{email}")
            assert status == 200, body
            assert json.loads(body)["email"] == email
            assert headers["X-Shard"] == f"shard{shard}"
        # The routing matters: every other instance calls the key misdirected.
        for other in instances:
            if other.index != shard:
                assert other.get(f"/person/{emails[0]}")[0] == 421
    for shard in range(SHARDS):
        status, _, body = nginx.get(f"/shard/{shard}/health")
        assert status == 200 and json.loads(body)["shard"] == f"{shard}/{SHARDS}"
    unknown = next(f"nobody{n}@example.invalid" for n in range(50)
                   if shard_of(f"nobody{n}@example.invalid", SHARDS) == 1)
    status, headers, _ = nginx.get(f"/person/{unknown}")
    assert (status, headers["X-Shard"]) == (404, "shard1")


def _connections_on(port):
    """Sockets of this host whose local port is `port`, other than the listener."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in list(handle)[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] != "0A":  # 0A: LISTEN
                    count += 1
    return count


def test_nginx_reuses_upstream_connections(cluster, people):
    nginx, instances = cluster
    emails = emails_by_shard(people, per_shard=200)[0]
    before = _connections_on(instances[0].port)
    connection = nginx.connection()
    for email in emails:
        connection.request("GET", f"/person/{email}")
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    connection.close()
    # Without keep-alive each request leaves a socket in TIME_WAIT on this port.
    assert _connections_on(instances[0].port) - before < 10


def test_a_killed_shard_fails_fast_with_503_and_the_others_keep_serving(cluster, people, tmp_path):
    nginx, instances = cluster
    groups = emails_by_shard(people, per_shard=100)
    victim = instances[1]
    with Load(nginx, [e for g in groups.values() for e in g], threads=3) as load:
        poll(lambda: load.count() > 300, 60, message="load before the kill")
        victim.kill_group()  # the whole process group, as a container or a cgroup dies
        killed_at = load.count()
        poll(lambda: load.statuses().get(1, {}).get(503, 0) >= 20, 30,
             message="503s from the dead shard")
        restarted = Instance(1, people, tmp_path, bind=f"127.0.0.1:{victim.port}").wait_ready()
        instances[1] = restarted
        poll(lambda: nginx.get(f"/person/{groups[1][0]}")[0] == 200, 30,
             message="the restarted shard to serve through nginx")
        back_at = load.count()
        poll(lambda: load.count() > back_at + 300, 60, message="load after the restart")
    table = load.statuses()
    assert set(table[0]) == {200} and set(table[2]) == {200}, table
    assert set(table[1]) <= {200, 503}, table  # never another shard's 404, never a 421
    assert table[1][503] >= 20 and killed_at > 0
    # Fast: nginx saw the connection refused, it did not wait for a timeout.
    assert "(111: Connection refused) while connecting to upstream" in nginx.log()
    assert "timed out" not in nginx.log()
    status, headers, body = nginx.get("/shard/1/health")
    assert status == 200
    restarted.kill_group()
    status, headers, body = nginx.get(f"/person/{groups[1][0]}")
    assert status == 503 and headers["Retry-After"] == "1"
    assert json.loads(body) == {"error": "shard unavailable", "shard": "shard1"}


def test_a_replica_takes_over_its_shard_when_the_other_server_dies(tmp_path, people):
    """Passive failover: two servers for shard 0; one is killed under load."""
    instances = []
    nginx = None
    try:
        instances.extend(start_instances(people, tmp_path))
        replica = Instance(0, people, tmp_path).wait_ready()
        instances.append(replica)
        nginx = Nginx.for_shards(tmp_path, [i.port for i in instances[:SHARDS]],
                                 replicas={0: [replica.port]}).start()
        groups = emails_by_shard(people, per_shard=100)
        with Load(nginx, [e for g in groups.values() for e in g], threads=3) as load:
            poll(lambda: load.count() > 300, 60, message="load before the kill")
            instances[0].kill_group()
            killed_at = load.count()
            poll(lambda: load.count() > killed_at + 600, 60, message="load after the kill")
        table = load.statuses()
        assert all(set(counts) == {200} for counts in table.values()), table
        # nginx did send to the dead server, failed, and went on to the replica.
        assert f'upstream: "http://127.0.0.1:{instances[0].port}/person/' in nginx.log()
    finally:
        if nginx is not None:
            nginx.stop()
        for instance in instances:
            instance.kill_group()


def test_rolling_reload_of_every_shard_through_nginx_fails_no_request(cluster, people):
    nginx, instances = cluster
    groups = emails_by_shard(people, per_shard=100)
    with Load(nginx, [e for g in groups.values() for e in g], threads=3) as load:
        poll(lambda: load.count() > 200, 60, message="load before the reload")
        result = rolling_reload(*(instance.stats_address for instance in instances))
        done_at = load.count()
        poll(lambda: load.count() > done_at + 200, 60, message="load after the reload")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("generation 2 serves") == SHARDS, result.stdout
    table = load.statuses()
    assert all(set(counts) == {200} for counts in table.values()), table
    for instance in instances:
        roles = {p["role"] for p in instance.stats()["processes"]}
        assert "supervisor" in roles
        assert {p["generation"] for p in instance.stats()["processes"]
                if p["role"] != "supervisor"} == {2}


# -- one application behind nginx, with TLS (docs/deployment.md) -------------------

ONE_APP_SECTION = "## One application behind nginx, with TLS"
APPS = ROOT / "tests" / "apps"


def one_app_server_block():
    """The ```nginx block of docs/deployment.md's one-application section."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split(ONE_APP_SECTION, 1)[1].split("\n## ", 1)[0]
    return re.search(r"^```nginx\n(.*?)^```", section, re.MULTILINE | re.DOTALL).group(1)


def self_signed_certificate(directory, name):
    """(certificate, key) for `name`, made by the openssl command line."""
    certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out",
                    str(certificate)], check=True, capture_output=True)
    return certificate, key


def test_the_one_application_tls_example_serves_https_through_nginx(tmp_path):
    certificate, key = self_signed_certificate(tmp_path, "app.example.com")
    server = ServerProcess(["-w", "1", "--forwarded-allow-ips", "127.0.0.1"],
                           app="proxied:app", cwd=APPS, log_dir=tmp_path)
    nginx = None
    try:
        server.wait_listening()

        def site(listen):
            unix, tcp = listen
            block = one_app_server_block()
            for documented, real in (
                    ("server 127.0.0.1:8000;", f"server 127.0.0.1:{server.port};"),
                    ("listen 443 ssl;", f"listen {tcp} ssl;"),
                    ("/etc/ssl/certs/app.example.com.pem", str(certificate)),
                    ("/etc/ssl/private/app.example.com.key", str(key))):
                assert documented in block, f"docs/deployment.md's block has no {documented!r}"
                block = block.replace(documented, real)
            # the harness's readiness probe (a 404 on the unix socket), then the example
            return f"server {{ listen {unix}; return 404; }}\n{block}"
        nginx = Nginx(tmp_path, site, tcp=True).start()

        def ask(path):
            url = f"https://app.example.com:{nginx.port}{path}"
            done = subprocess.run(["curl", "-sS", "--fail", "--cacert", str(certificate),
                                   "--resolve", f"app.example.com:{nginx.port}:127.0.0.1", url],
                                  capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, done.stderr + nginx.log()
            return json.loads(done.stdout)
        answers = [ask(f"/{n}") for n in range(6)]  # a new client connection each
    finally:
        if nginx is not None:
            nginx.stop()
        server.kill_group()
    first = answers[0]
    assert first["wsgi.url_scheme"] == "https"  # X-Forwarded-Proto, from a trusted address
    assert first["HTTP_HOST"] == "app.example.com"
    assert first["HTTP_X_FORWARDED_FOR"] == "127.0.0.1" and first["REMOTE_ADDR"] == "127.0.0.1"
    # upstream keep-alive: nginx reuses its connections to forkserve across clients
    assert len({answer["REMOTE_PORT"] for answer in answers}) <= 2, answers
