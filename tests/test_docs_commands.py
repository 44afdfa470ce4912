"""What a user copies from the docs runs as written.

Every command in a fenced ```sh / ```bash / ```shell / ```console block of
README.md, docs/ and the examples' READMEs is taken from the Markdown itself
(so this test follows the docs as they change) and run, page by page, in
order, from a scratch copy of the repository (a quick start that makes
`.venv` must not touch the developer's), with this interpreter's bin
directory first on PATH (as an activated virtualenv would be):

- a command that starts a server (`forkserve ... MODULE:APP`) is started in
  its own process group, waited for until it logs that it listens, probed
  with an HTTP request, and stopped with SIGTERM (it must exit 0) at the end
  of the page or when a later command starts a server on the same
  documented port. Its addresses are bound on 127.0.0.1 port 0, never the
  documented port: `-b`/`--stats` addresses become 127.0.0.1:0 (no `-b`:
  FORKSERVE_BIND=127.0.0.1:0), and the documented ports in later commands
  are replaced by the ones the server logged;
- `examples/deploy/run-local` is started, each command it prints is run
  while it serves, then it gets Ctrl-C (SIGINT) and must exit 0 having
  stopped nginx;
- `curl` gets `-f`, so an HTTP error fails the command;
- any other command must exit 0 within its time bound;
- after every command `git status` is as clean as before: what a documented
  command writes (generated data, logs, a virtualenv) lands outside the
  clone or in a git-ignored folder.

QUICK lists the options made smaller so the page runs in seconds (fewer
rows, shorter load tests); NOT_RUN lists each command this test cannot run,
with the reason. The placeholders for "your application" (`myproject`,
`app:app`) are small WSGI modules this test writes into the scratch copy.
"""

import http.client
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from forkserve_testing import ctrl_c_reaches_it, kill_group, poll

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^\s*(```|~~~)\s*(\S*)")

#: pages whose commands run; docs/benchmarks.md is the benchmarks' own page,
#: whose scripts tests/test_benchmarks_*.py run with --quick
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "examples").glob("**/README.md")])
PAGES = [page for page in PAGES if page != ROOT / "docs" / "benchmarks.md"]

#: (pattern, why this test does not run the command)
NOT_RUN = [
    (r"^tools/test\b", "the whole suite in a fresh virtualenv (about 8 minutes); CI runs it"),
    (r"^cp examples/deploy/systemd/\* /etc/systemd/system/",
     "installs units into /etc: needs root on a systemd host (tests/test_deploy_manifests.py "
     "verifies the units with systemd-analyze)"),
    (r"^systemctl ", "needs root and systemd as PID 1"),
    (r"^pip install -e '\.\[locust\]'",
     "installs into the environment the tests run in, whose test extras already hold locust"),
    (r"^examples/deploy/rolling-reload 127\.0\.0\.1:9100 ",
     "needs three instances already serving stats at fixed addresses; this test runs the "
     "rolling-reload line that run-local prints, with the ports it bound"),
]

#: (pattern, replacement): the quick options of long commands
QUICK = [
    (r"--rows (\d{4,})", lambda m: f"--rows {min(int(m.group(1)), 3000)}"),
    (r"-t (\d+)s\b", "-t 5s"),
]

#: "your application" in the docs
FIXTURES = {
    "myproject/__init__.py": "",
    "myproject/wsgi.py": (
        "def application(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'myproject\\n']\n"),
    "myproject/app.py": (
        "def create_app(name):\n"
        "    def app(environ, start_response):\n"
        "        start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "        return [name.encode() + b'\\n']\n"
        "    return app\n"),
    "app.py": "from myproject.wsgi import application as app\n",
}

TIMEOUT = 120           # seconds, a command or a server's start
SLOW = {r"pip install": 600}
ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|0\.0\.0\.0|localhost):(\d+)\b")
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")
STATS = re.compile(r"Stats at: http://127\.0\.0\.1:(\d+)")
ASSIGNMENT = re.compile(r"^\w+=")


def commands(text):
    """(line, command) for each command in the page's shell blocks: `\\`
    continuations joined, a `$ ` prompt dropped, comment lines skipped."""
    language, pending, start = None, [], 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(2)
            continue
        if language not in SHELL_BLOCKS:
            continue
        stripped = line.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        yield start, " ".join([*pending, stripped])
        pending = []


def not_run_reason(command):
    return next((why for pattern, why in NOT_RUN if re.search(pattern, command)), None)


def program_and_arguments(command):
    words = shlex.split(command, comments=True)
    while words and ASSIGNMENT.match(words[0]):
        words.pop(0)
    return (words[0], words[1:]) if words else ("", [])


def starts_a_server(command):
    program, arguments = program_and_arguments(command)
    if pathlib.PurePath(program).name != "forkserve" or not arguments:
        return False
    if arguments[0] in ("memory", "store"):
        return False
    return not {"--check-config", "--print-config", "-h", "--help", "-V",
                "--version"} & set(arguments)


def is_run_local(command):
    return program_and_arguments(command)[1][:1] == ["examples/deploy/run-local"] or \
        program_and_arguments(command)[0] == "examples/deploy/run-local"


class Server:
    """A documented server command, bound on port 0 and probed."""

    def __init__(self, command, session):
        self.session = session
        self.documented = []   # documented ports, in the order of the logged ones
        stats = []

        def to_port_zero(match):
            flag = match.group(1)
            port = int(ADDRESS.search(match.group(2)).group(1))
            (stats if flag == "--stats" else self.documented).append(port)
            return f"{flag} 127.0.0.1:0"

        self.command = re.sub(r"(-b|--bind|--stats)[ =](\S+:\d+)", to_port_zero, command)
        env = dict(session.env)
        if not self.documented:
            env["FORKSERVE_BIND"] = "127.0.0.1:0"
            self.documented = [8000]
        self.stats_documented = stats
        session.stop_servers_on(self.documented + stats)
        self.log = session.scratch / f"server-{len(session.servers)}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(["bash", "-c", self.command], cwd=session.directory,
                                            env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.ports = {}

    def wait_and_probe(self, timeout):
        def listening():
            text = self.log.read_text(errors="replace")
            ports = [int(port) for port in LISTENING.findall(text)]
            stats = [int(port) for port in STATS.findall(text)]
            if self.process.poll() is not None:
                raise AssertionError(f"`{self.command}` exited with {self.process.returncode}:"
                                     f"\n{text[-3000:]}")
            if len(ports) >= len(self.documented) and len(stats) >= len(self.stats_documented):
                return ports, stats
            return None
        ports, stats = poll(listening, timeout, interval=0.1, message=f"`{self.command}` to listen")
        self.ports = dict(zip(self.documented, ports)) | dict(zip(self.stats_documented, stats))
        for port in ports:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("GET", "/")
                status = connection.getresponse().status
            finally:
                connection.close()
            assert status < 500, f"`{self.command}` answered GET / with {status}"

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                kill_group(self.process, 10)
                raise AssertionError(f"`{self.command}` did not stop on SIGTERM within 60 s")
        text = self.log.read_text(errors="replace")
        assert self.process.returncode == 0, (
            f"`{self.command}` exited with {self.process.returncode} on SIGTERM:\n{text[-3000:]}")


class Session:
    """One page's commands, in order, in a scratch copy of the repository."""

    def __init__(self, directory):
        self.directory = directory
        self.servers = []
        self.ran = []
        self.scratch = directory.parent / "scratch"  # outside the clone: logs, TMPDIR
        tmp = self.scratch / "tmp"
        tmp.mkdir(parents=True)
        bin_dir = os.path.dirname(sys.executable)
        self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TMPDIR=str(tmp),
                        PYTHONDONTWRITEBYTECODE="1")
        for name in ("FORKSERVE_BIND", "FORKSERVE_CMD_ARGS", "PERSONDB_CSV", "VIRTUAL_ENV"):
            self.env.pop(name, None)

    def addresses(self, command):
        """The documented ports of running servers replaced by the real ones."""
        ports = {doc: real for server in self.servers for doc, real in server.ports.items()}
        return ADDRESS.sub(lambda m: f"127.0.0.1:{ports[int(m.group(1))]}"
                           if int(m.group(1)) in ports else m.group(0), command)

    def stop_servers_on(self, ports):
        for server in [s for s in self.servers if set(s.ports) & set(ports)]:
            self.servers.remove(server)
            server.stop()

    def stop_all(self):
        while self.servers:
            self.servers.pop().stop()

    def run(self, command):
        for pattern, replacement in QUICK:
            command = re.sub(pattern, replacement, command)
        for part in command.split(" && "):
            part = part.strip().removesuffix("&").strip()
            if starts_a_server(part):
                server = Server(part, self)
                self.servers.append(server)
                server.wait_and_probe(TIMEOUT)
                self.ran.append(f"server: {server.command}")
            elif is_run_local(part):
                self.run_local(part)
            else:
                self.run_to_the_end(self.addresses(part))
            self.assert_clone_clean(part)

    def assert_clone_clean(self, command):
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                                cwd=self.directory, capture_output=True, text=True, check=True)
        assert not status.stdout, (f"`{command}` left files in the clone (write them outside "
                                   f"it or in a git-ignored folder):\n{status.stdout[:2000]}")

    def run_to_the_end(self, command):
        if program_and_arguments(command)[0] == "curl":
            command = re.sub(r"^curl\b", "curl -f", command)
        timeout = next((t for pattern, t in SLOW.items() if re.search(pattern, command)), TIMEOUT)
        result = subprocess.run(["bash", "-c", command], cwd=self.directory, env=self.env,
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, (f"`{command}` exited with {result.returncode}:\n"
                                        f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        self.ran.append(command)

    def run_local(self, command):
        output = self.scratch / "run-local.out"
        with open(output, "wb") as out:
            process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.directory,
                                       env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=ctrl_c_reaches_it)
        try:
            def serving():
                text = output.read_text(errors="replace")
                if process.poll() is not None:
                    raise AssertionError(f"`{command}` exited with {process.returncode}:\n{text}")
                return "Ctrl-C stops" in text and text
            text = poll(serving, 180, interval=0.2, message=f"`{command}` to serve")
            printed = [line.strip() for line in text.splitlines() if line.startswith("  ")]
            assert printed, f"`{command}` printed no command to run:\n{text}"
            for line in printed:
                self.run_to_the_end(line)
            directory = re.search(r"config in (\S+)", text).group(1)
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(60) == 0, output.read_text(errors="replace")
            assert not pathlib.Path(directory, "nginx.pid").exists(), "nginx still runs"
            self.ran.append(f"{command} (then Ctrl-C)")
        finally:
            if process.poll() is None:
                kill_group(process, 10)


def scratch_copy(target):
    shutil.copytree(ROOT, target, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", "*.egg-info", "build", "out", "*.pyc"))
    for name, text in FIXTURES.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # A clone, as a user has it: its .gitignore applies, and `git status`
    # shows what a command leaves behind.
    git = ["git", "-c", "user.name=docs", "-c", "user.email=docs@localhost"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the clone"]):
        subprocess.run(git + command, cwd=target, check=True, capture_output=True)
    return target


PAGES_WITH_COMMANDS = [page for page in PAGES
                       if any(True for _ in commands(page.read_text(encoding="utf-8")))]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS,
                         ids=[str(page.relative_to(ROOT)) for page in PAGES_WITH_COMMANDS])
def test_every_command_on_the_page_runs_as_written(page, tmp_path):
    if not shutil.which("nginx") and not shutil.which("nginx", path="/usr/sbin"):
        if "run-local" in page.read_text(encoding="utf-8"):
            pytest.skip("nginx is not installed")
    session = Session(scratch_copy(tmp_path / "repo"))
    try:
        for number, command in commands(page.read_text(encoding="utf-8")):
            if not_run_reason(command):
                continue
            try:
                session.run(command)
            except (AssertionError, subprocess.TimeoutExpired) as error:
                raise AssertionError(f"{page.relative_to(ROOT)}:{number}: {error}") from None
    finally:
        session.stop_all()
        print(f"{page.relative_to(ROOT)}: ran", *session.ran, sep="\n  ")
    assert session.ran


def test_every_command_not_run_is_still_in_the_docs_and_has_a_reason():
    everything = [command for page in PAGES
                  for _, command in commands(page.read_text(encoding="utf-8"))]
    for pattern, why in NOT_RUN:
        assert why and any(re.search(pattern, command) for command in everything), (
            f"NOT_RUN's {pattern!r} matches no command in the docs any more: remove it")


def test_commands_are_read_from_fenced_shell_blocks_with_continuations():
    text = ("```sh\n# a comment\nforkserve -w 2 \\\n    app:app\n\n$ curl -s x\n```\n"
            "```\n$ not run: output\n```\n```python\nprint(1)\n```\n")
    assert list(commands(text)) == [(3, "forkserve -w 2 app:app"), (6, "curl -s x")]
    assert starts_a_server("PERSONDB_MODE=share forkserve -w 4 examples.persondb.app:app")
    assert not starts_a_server("forkserve memory 127.0.0.1:9100")
    assert not starts_a_server("forkserve store build people.csv --key email -o p.store")
