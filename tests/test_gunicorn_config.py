"""Gunicorn config files and flags: honoured under Gunicorn's names, or refused by name."""

import pathlib
import textwrap

import pytest

from forkserve.config import gunicorn
from forkserve.config.settings import ConfigError, parse

ROOT = pathlib.Path(__file__).resolve().parent.parent


def write(tmp_path, text, name="gunicorn.conf.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_every_gunicorn_setting_has_a_row_saying_what_forkserve_does():
    known = pytest.importorskip("gunicorn.config").KNOWN_SETTINGS
    missing = sorted({setting.name for setting in known} - set(gunicorn.BY_NAME))
    assert not missing, f"add rows to forkserve/config/gunicorn.py for: {missing}"


def test_gunicorn_hooks_take_gunicorns_number_of_arguments():
    known = {s.name: s for s in pytest.importorskip("gunicorn.config").KNOWN_SETTINGS}
    for name, arity in gunicorn.HOOKS.items():
        assert known[name].section == "Server Hooks"
        # Gunicorn's default hook has exactly the arguments a user's hook gets
        import inspect
        assert len(inspect.signature(known[name].default).parameters) == arity, name


def test_docs_gunicorn_table_is_generated_from_the_rows():
    page = (ROOT / "docs" / "gunicorn.md").read_text()
    assert gunicorn.table() in page, (
        "docs/gunicorn.md's table is stale: paste in the output of "
        "python -m forkserve.config.gunicorn")


def test_a_typical_gunicorn_config_file_is_read_under_gunicorns_names(tmp_path):
    path = write(tmp_path, """
        import multiprocessing
        import os
        from os.path import join

        bind = "127.0.0.1:0"
        workers = multiprocessing.cpu_count() * 0 + 3
        worker_class = "gevent"
        accesslog = "-"
        errorlog = "/tmp/error.log"
        loglevel = "warning"
        keepalive = 7
        proc_name = "shop"
        pidfile = "/tmp/shop.pid"
        preload_app = True
        raw_env = ["DJANGO_SETTINGS_MODULE=shop.settings"]
        forwarded_allow_ips = "10.0.0.0/8,127.0.0.1"
        secure_scheme_headers = {"X-Forwarded-Proto": "https"}
        access_log_format = '%(h)s "%(r)s" %(s)s %(D)s'
        _base = join("/srv", "shop")

        def _helper():
            return 1

        def post_fork(server, worker):
            pass

        def when_ready(server):
            pass
        """)
    cfg = parse(["-c", path, "shop.wsgi"], environ={}, cwd=str(tmp_path))
    assert (cfg.workers, cfg.access_logfile, cfg.error_logfile, cfg.log_level) == (
        3, "-", "/tmp/error.log", "warning")
    assert (cfg.keep_alive, cfg.name, cfg.pid) == (7.0, "shop", "/tmp/shop.pid")
    assert cfg.raw_env == ["DJANGO_SETTINGS_MODULE=shop.settings"]
    assert cfg.forwarded_allow_ips == ["10.0.0.0/8", "127.0.0.1"]
    assert cfg.secure_scheme_headers == {"X-FORWARDED-PROTO": "https"}
    assert cfg.access_log_format == '%(h)s "%(r)s" %(s)s %(D)s'
    assert sorted(cfg.hooks) == ["post_fork", "when_ready"]
    assert cfg.sources["keep_alive"] == f"config file {path}"


@pytest.mark.parametrize("text, message", [
    pytest.param("workers = 2\nkeepalvie = 5\n",
                 r"unknown setting 'keepalvie'; did you mean 'keepalive'",
                 id="a misspelled setting is named"),
    pytest.param("BASE_DIR = '/srv'\n", r"'BASE_DIR'.*start its name with '_'",
                 id="a plain value that is not a setting says what to do"),
    pytest.param("def post_forkk(server, worker):\n    pass\n",
                 r"'post_forkk' is not a server hook; did you mean 'post_fork'",
                 id="a misspelled hook"),
    pytest.param("def post_fork(worker):\n    pass\n", "hook post_fork must take 2 argument",
                 id="a hook with the wrong arguments"),
])
def test_a_mistake_in_a_config_file_is_an_error_that_says_what_it_is(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message):
        parse(["-c", path, "a:b"], environ={}, cwd=str(tmp_path))


@pytest.mark.parametrize("line, message", [
    ('worker_class = "uvicorn.workers.UvicornWorker"', "forkserve workers are always gevent"),
    ('worker_class = "asgi"', "serve WSGI"),
    ("reuse_port = True", "SO_REUSEPORT"),
    ('control_socket = "/run/gunicorn.ctl"', "controlled by signals"),
    ('paste = "production.ini"', "Paste Deployment"),
    ('header_map = "dangerous"', "not supported"),
    ('http2_cleartext = "on"', "HTTP/2"),
])
def test_a_setting_forkserve_cannot_honour_is_refused_with_the_reason(tmp_path, line, message):
    path = write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as caught:
        parse(["-c", path, "a:b"], environ={}, cwd=str(tmp_path))
    assert message in str(caught.value)
    assert line.split(" = ")[0] in str(caught.value)


def test_refused_settings_at_values_that_change_nothing_are_accepted(tmp_path):
    path = write(tmp_path, """
        import ssl
        worker_class = "gevent"
        threads = 1
        daemon = False
        preload_app = True
        reuse_port = False
        sendfile = None
        cert_reqs = ssl.CERT_NONE
        """)
    assert parse(["-c", path, "a:b"], environ={}, cwd=str(tmp_path)).warnings == []


@pytest.mark.parametrize("line, why", [
    ("threads = 4", "as Gunicorn's gevent worker ignores threads"),
    ('worker_tmp_dir = "/dev/shm"', "writes no file"),
    ('worker_class = "sync"', "runs in greenlets"),
    ('worker_class = "gthread"', "runs in greenlets"),
    ("preload_app = False", "start it in post_fork"),
    ("initgroups = False", "supplementary groups"),
    ("spew = True", "no line tracer"),
    ('tmp_upload_dir = "/tmp/uploads"', "Gunicorn does not use it either"),
    ("enable_backlog_metric = True", "gunicorn.backlog"),
    ("ssl_version = 5", "Gunicorn ignores it too"),
    ('http_protocols = "h2,h1"', "serves every client HTTP/1.1"),
    ('header_map = "refuse"', "instead of refusing it"),
    ('root_path = "/api"', "SCRIPT_NAME"),
    ("dirty_workers = 2", "only with dirty_apps"),
    ("def on_dirty_starting(arbiter):\n    pass", "only with dirty_apps"),
    ('http_parser = "fast"', "one HTTP parser"),
])
def test_a_setting_with_no_effect_starts_with_a_warning_that_says_why(tmp_path, line, why):
    path = write(tmp_path, "workers = 2\n" + line + "\n")
    cfg = parse(["-c", path, "a:b"], environ={}, cwd=str(tmp_path))
    [warning] = cfg.warnings
    name = line.split(" = ")[0].removeprefix("def ").partition("(")[0]
    assert f"{name} = " in warning and "has no effect under forkserve" in warning
    assert why in warning and path in warning
    assert cfg.workers == 2


#: Gunicorn's defaults that forkserve does differently on purpose (a gevent worker, the
#: app preloaded, the user's groups, no control socket): written out, each warns
DIFFERENT_DEFAULTS = {"worker_class", "preload_app", "initgroups", "control_socket",
                      "control_socket_disable", "uwsgi_allow_ips"}


def test_gunicorns_own_defaults_pass_silently_unless_forkserve_differs_there():
    known = pytest.importorskip("gunicorn.config").KNOWN_SETTINGS
    for setting in known:
        row = gunicorn.BY_NAME[setting.name]
        if row.kind in ("ignored", "refused") and not callable(setting.default):
            outcome = (None, None) if setting.name not in DIFFERENT_DEFAULTS else "other"
            try:
                silent = gunicorn.translate(setting.name, setting.default) == (None, None)
            except ValueError:
                silent = False
            assert silent == (outcome == (None, None)), setting.name


def test_one_reading_names_every_refused_setting_typo_and_bad_value(tmp_path):
    path = write(tmp_path, """
        threads = 4
        reuse_port = True
        acesslog = "-"
        worker_tmp_dir = "/dev/shm"
        timeout = "soon"
        """)
    with pytest.raises(ConfigError) as caught:
        parse(["-c", path, "--threads", "2", "--paste", "p.ini", "--no-such-flag", "a:b"],
              environ={"FORKSERVE_WORKERS": "many"}, cwd=str(tmp_path))
    errors = str(caught.value).splitlines()
    assert len(errors) == 6, errors
    for expected in ("reuse_port = True", "unknown setting 'acesslog'", "timeout", "paste",
                     "unknown option --no-such-flag", "FORKSERVE_WORKERS"):
        assert any(expected in error for error in errors), (expected, errors)
    assert len(caught.value.warnings) == 3
    assert any("command line: threads = '2' has no effect" in w for w in caught.value.warnings)


def test_a_gunicorn_command_line_works_after_changing_one_word(tmp_path):
    cfg = parse(["--preload", "--proxy-protocol", "-k", "gevent", "-t", "12", "-p", "x.pid",
                 "--log-file", "e.log", "--keep-alive", "4", "-e", "A=1", "-e", "B=x=y",
                 "--forwarded-allow-ips", "*", "a:b"], environ={}, cwd=str(tmp_path))
    assert (cfg.timeout, cfg.pid, cfg.error_logfile, cfg.keep_alive) == (12.0, "x.pid", "e.log", 4.0)
    assert cfg.raw_env == ["A=1", "B=x=y"]
    assert cfg.forwarded_allow_ips == ["*"]
    assert cfg.proxy_protocol == "auto"


def test_a_refused_gunicorn_flag_names_itself(tmp_path):
    with pytest.raises(ConfigError,
                       match="command line: forkserve does not support reuse_port = True"):
        parse(["--reuse-port", "a:b"], environ={}, cwd=str(tmp_path))


def test_a_gunicorn_flag_with_no_effect_is_a_warning(tmp_path):
    cfg = parse(["--threads", "8", "--worker-tmp-dir", "/dev/shm", "a:b"], environ={},
                cwd=str(tmp_path))
    assert [w.partition(" has")[0] for w in cfg.warnings] == [
        "command line: threads = '8'", "command line: worker_tmp_dir = '/dev/shm'"]


def test_forkserve_cmd_args_work_like_gunicorn_cmd_args(tmp_path):
    environ = {"FORKSERVE_CMD_ARGS": "-w 3 --timeout 9 --access-logfile - app:app",
               "FORKSERVE_WORKERS": "5"}
    cfg = parse(["--timeout", "4"], environ=environ, cwd=str(tmp_path))
    assert cfg.app == "app:app"
    assert (cfg.workers, cfg.timeout, cfg.access_logfile) == (3, 4.0, "-")
    assert cfg.sources["workers"] == "environment FORKSERVE_CMD_ARGS"


def test_gunicorn_conf_py_in_the_working_directory_is_read_like_gunicorn_does(tmp_path):
    write(tmp_path, "workers = 2\nkeepalive = 9\n")
    cfg = parse(["a:b"], environ={}, cwd=str(tmp_path))
    assert (cfg.workers, cfg.keep_alive) == (2, 9.0)


@pytest.mark.parametrize("value", ["10.0.0.0/33", "example.com"])
def test_a_bad_forwarded_allow_ips_entry_is_named(tmp_path, value):
    with pytest.raises(ConfigError, match="is not an IP address, a network"):
        parse(["--forwarded-allow-ips", value, "a:b"], environ={}, cwd=str(tmp_path))


def test_a_broken_access_log_format_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError, match="access_log_format.*not a %-format"):
        parse(["--access-logformat", "%(h)s %(", "a:b"], environ={}, cwd=str(tmp_path))


def test_gunicorn_table_has_a_row_per_setting_and_no_duplicates():
    names = [row.name for row in gunicorn.ROWS]
    assert len(names) == len(set(names))
    for row in gunicorn.ROWS:
        assert row.kind in ("honoured", "hook", "ignored", "refused") and row.note


def test_worker_hooks_with_no_workers_are_reported_as_ignored(tmp_path):
    from forkserve.config import ignored
    path = write(tmp_path, "def post_fork(server, worker):\n    pass\n"
                           "def when_ready(server):\n    pass\n")
    cfg = parse(["-c", path, "-w", "0", "a:b"], environ={}, cwd=str(tmp_path))
    messages = ignored.check(cfg, {}, 123)
    assert len(messages) == 1 and "post_fork hook never runs with -w 0" in messages[0]
    assert ignored.check(cfg.with_values(workers=2), {}, 123) == []


def test_bind_beside_systemd_socket_activation_is_reported_as_ignored(tmp_path):
    from forkserve.config import ignored
    cfg = parse(["-b", "127.0.0.1:9000", "a:b"], environ={}, cwd=str(tmp_path))
    activated = {"LISTEN_FDS": "1", "LISTEN_PID": "123"}
    [message] = ignored.check(cfg, activated, 123)
    assert "127.0.0.1:9000" in message and "ListenStream=" in message
    assert ignored.check(parse(["a:b"], environ={}, cwd=str(tmp_path)), activated, 123) == []
    assert ignored.check(cfg, {"LISTEN_FDS": "1", "LISTEN_PID": "999"}, 123) == []


def test_numeric_user_and_group_and_web_concurrency_as_in_gunicorn(tmp_path, monkeypatch):
    path = write(tmp_path, "user = 0\ngroup = 0\n")
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    cfg = parse(["-c", path, "a:b"], environ={}, cwd=str(tmp_path))
    assert (cfg.user, cfg.group, cfg.workers) == ("0", "0", 3)


def test_a_logconfig_dict_that_cannot_survive_a_reload_is_refused(tmp_path):
    path = write(tmp_path, "import logging\nlogconfig_dict = {'version': 1, "
                           "'filters': {'f': {'()': logging.Filter}}}\n")
    with pytest.raises(ConfigError, match="name classes and functions by dotted path"):
        parse(["-c", path, "a:b"], environ={}, cwd=str(tmp_path))


def test_a_config_file_that_cannot_be_read_is_named_with_the_command_lines_problems(tmp_path):
    with pytest.raises(ConfigError) as caught:
        parse(["-c", str(tmp_path / "missing.conf.py"), "--reuse-port", "a:b"], environ={},
              cwd=str(tmp_path))
    errors = str(caught.value).splitlines()
    assert len(errors) == 2 and "does not exist" in errors[1] and "reuse_port" in errors[0]
