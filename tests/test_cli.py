"""The command line: --help's shape, -V, did-you-mean, --print-config."""

import subprocess
import sys

import pytest

import forkserve
from forkserve.config import effective, gunicorn
from forkserve.config.settings import SECTION_TITLES, SETTINGS, ConfigError, parse


def forkserve_cli(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "forkserve", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def test_help_groups_settings_by_section_and_names_gunicorns_flags_in_one_paragraph():
    result = forkserve_cli("--help")
    assert result.returncode == 0
    text = result.stdout
    headings = [text.index(f"\n{title}:\n") for title in SECTION_TITLES.values()]
    assert headings == sorted(headings)
    for setting in [s for s in SETTINGS if s.in_help]:  # each under its section's heading
        title = SECTION_TITLES.get(setting.section, setting.section.capitalize())
        section_start = text.index(f"\n{title}:\n")
        following = [h for h in headings if h > section_start]
        section_end = following[0] if following else len(text)
        assert setting.flags[-1] in text[section_start:section_end], setting.name
    paragraph = text[text.index("\nGunicorn's flags:\n"):]
    for setting in [s for s in SETTINGS if not s.in_help]:  # named among Gunicorn's
        assert setting.flags[-1] in paragraph and setting.help not in text, setting.name
    assert "docs/gunicorn.md" in paragraph
    for row in gunicorn.ROWS:  # named, not described: their reasons live in the docs
        assert row.note not in text or row.kind == "honoured"
    assert "--worker-class" in paragraph and "--ssl-version" in paragraph
    assert "forkserve store" in text.split("\n\n")[0]  # the usage
    assert len(text.splitlines()) <= 200, (
        "forkserve --help is at most 200 lines: move the rest of a help text to its details")


def test_dash_capital_v_prints_the_version():
    result = forkserve_cli("-V")
    assert (result.returncode, result.stdout.strip()) == (0, f"forkserve {forkserve.__version__}")


def test_a_mistyped_flag_gets_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match="unknown option --max-requsts; did you mean "
                                          "--max-requests?"):
        parse(["--max-requsts", "3", "a:b"], environ={}, cwd=str(tmp_path))


def test_a_flag_like_nothing_known_says_where_to_look(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown option --zzzz \(see forkserve --help\)"):
        parse(["--zzzz", "a:b"], environ={}, cwd=str(tmp_path))


def test_a_mistyped_flag_in_forkserve_cmd_args_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="environment FORKSERVE_CMD_ARGS: unknown option "
                                          "--timout; did you mean --timeout?"):
        parse(["a:b"], environ={"FORKSERVE_CMD_ARGS": "--timout 3"}, cwd=str(tmp_path))


def test_print_config_says_where_each_value_came_from(tmp_path):
    (tmp_path / "gunicorn.conf.py").write_text(
        "workers = 3\nbind = '127.0.0.1:0'\ndef post_fork(server, worker):\n    pass\n")
    environ = {"FORKSERVE_CMD_ARGS": "--timeout 9", "FORKSERVE_KEEP_ALIVE": "2"}
    cfg = parse(["--print-config", "--max-requests", "5", "a:b"], environ=environ,
                cwd=str(tmp_path))
    lines = {line.split(" = ")[0]: line for line in effective.render(cfg).splitlines()}
    config = tmp_path / "gunicorn.conf.py"
    assert lines["app"].endswith("'a:b'") or "# command line" in lines["app"]
    assert lines["workers"].startswith("workers = 3 ") and lines["workers"].endswith(
        f"# config file {config}")
    assert lines["timeout"].endswith("# environment FORKSERVE_CMD_ARGS")
    assert lines["keep_alive"].endswith("# environment FORKSERVE_KEEP_ALIVE")
    assert lines["max_requests"].endswith("# command line")
    assert lines["backlog"].endswith("# default")
    assert lines["config"].endswith("# found in the working directory")
    assert "print_config" not in lines
    assert any("post_fork" in line for line in lines if line.startswith("# server hooks"))


def test_print_config_shows_a_umask_in_octal(tmp_path):
    (tmp_path / "uwsgi.ini").write_text("[uwsgi]\nmodule = a:b\nchmod-socket = 666\n")
    lines = effective.render(parse(["--ini", str(tmp_path / "uwsgi.ini")], environ={},
                                   cwd=str(tmp_path))).splitlines()
    assert [line.split("#")[0].strip() for line in lines if line.startswith("umask")] == [
        "umask = 0o111"]
    lines = effective.render(parse(["a:b"], environ={}, cwd=str(tmp_path))).splitlines()
    assert any(line.startswith("umask = 0o000 ") for line in lines)


def test_print_config_exits_zero_without_serving(tmp_path):
    result = forkserve_cli("--print-config", "-w", "2", "no_such_module:app", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "workers = 2" in result.stdout and "# command line" in result.stdout
    assert "Listening" not in result.stderr
