"""forkserve.config.uwsgi, pure: uWSGI's ini options into forkserve's settings
(the one table), its placeholders, its errors; and settings.parse reading an
ini by --ini and by -c."""

import os
import pathlib

import pytest

from forkserve.config import settings, uwsgi

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = {"RUN": "/run/shop", "HOME": "/root"}

#: every option issue 34 names
ISSUE_OPTIONS = (
    "module", "wsgi-file", "callable", "http", "http-socket", "socket", "processes", "workers",
    "master", "harakiri", "max-requests", "reload-on-rss", "evil-reload-on-rss", "listen",
    "buffer-size", "chdir", "pythonpath", "env", "pidfile", "stats", "disable-logging", "logto",
    "die-on-term", "vacuum", "cpu-affinity", "gevent", "touch-reload", "lazy-apps",
    "enable-threads", "thunder-lock", "single-interpreter", "need-app", "strict")


def translate(text, path="/srv/shop/deploy/uwsgi.ini", environ=ENV):
    return uwsgi.translate("[uwsgi]\n" + text, path, environ)


def values(text, **kwargs):
    result = translate(text, **kwargs)
    assert not result.errors, result.errors
    return result.values


def errors(text):
    return translate(text).errors


def test_every_option_the_issue_names_has_a_row_and_every_row_a_reason():
    for name in ISSUE_OPTIONS:
        assert name in uwsgi.BY_NAME, name
    for option in uwsgi.OPTIONS:
        assert option.kind in ("honoured", "mapped", "warned", "refused")
        assert option.note and (option.apply is None) == (option.kind == "refused")
    names = [name for option in uwsgi.OPTIONS for name in (option.name, *option.aliases)]
    assert len(names) == len(set(names)), "an option is in two rows"


def test_docs_uwsgi_table_is_generated_from_the_rows():
    page = (ROOT / "docs" / "uwsgi.md").read_text()
    assert uwsgi.table() in page and uwsgi.summary() in page, (
        "docs/uwsgi.md's table is stale: paste in the output of python -m forkserve.config.uwsgi")


def test_a_django_ini_maps_to_forkserve_settings():
    found = values("chdir = /srv/shop\nmodule = shop.wsgi:application\nmaster = true\n"
                   "processes = 4\nsocket = /run/shop.sock\nhttp-socket = :8000\n"
                   "harakiri = 30\nmax-requests = 5000\nreload-on-rss = 512\nlisten = 128\n"
                   "buffer-size = 32k\nenv = DJANGO_SETTINGS_MODULE=shop.settings\n"
                   "env = LANG=C.UTF-8\npidfile = /run/shop.pid\nstats = 127.0.0.1:9191\n"
                   "logto = /var/log/shop.log\ngevent = 200\ncpu-affinity = 1\n"
                   "touch-reload = reload.txt\nuid = www-data\ngid = www-data\numask = 022\n")
    assert found == {
        "chdir": "/srv/shop", "app": "shop.wsgi:application", "workers": 4,
        "bind": ["uwsgi:unix:/run/shop.sock", "http::8000"], "timeout": 30,
        "max_requests": 5000, "max_worker_memory": 512, "backlog": 128,
        "limit_request_field_size": 32768,
        "raw_env": ["DJANGO_SETTINGS_MODULE=shop.settings", "LANG=C.UTF-8"],
        "pid": "/run/shop.pid", "stats": "127.0.0.1:9191", "error_logfile": "/var/log/shop.log",
        "worker_connections": 200, "cpu_affinity": "on",
        "touch_reload": ["/srv/shop/deploy/reload.txt"], "user": "www-data",
        "group": "www-data", "umask": "0o22"}
    # the settings' own converters take every value
    for name, value in found.items():
        if name != "app":
            settings.BY_NAME[name].convert(value)


@pytest.mark.parametrize("option, address, bind", [
    ("socket", "127.0.0.1:3031", "uwsgi:127.0.0.1:3031"),
    ("socket", ":3031", "uwsgi::3031"),
    ("uwsgi-socket", "[::1]:3031", "uwsgi:[::1]:3031"),
    ("socket", "/run/app.sock", "uwsgi:unix:/run/app.sock"),
    ("socket", "relative.sock", "uwsgi:unix:relative.sock"),
    ("http-socket", "0.0.0.0:8080", "http:0.0.0.0:8080"),
    ("http", ":9090", "http::9090"),
])
def test_addresses_become_bind_addresses_that_name_their_protocol(option, address, bind):
    assert values(f"{option} = {address}")["bind"] == [bind]


def test_protocol_option_is_forkserve_s_protocol_setting():
    assert values("protocol = http\nsocket = :8000") == {"protocol": "http",
                                                         "bind": ["uwsgi::8000"]}


def test_module_callable_and_wsgi_file_name_the_application():
    assert values("module = shop.wsgi")["app"] == "shop.wsgi:application"
    assert values("wsgi = shop.wsgi\ncallable = app")["app"] == "shop.wsgi:app"
    assert values("module = shop.wsgi:app")["app"] == "shop.wsgi:app"
    found = values("wsgi-file = app/main.py\ncallable = app")
    assert found == {"app": "main:app", "pythonpath": "/srv/shop/deploy/app"}
    assert "both name the callable" in errors("module = a:b\ncallable = c")[0]
    assert "cannot be imported by name" in errors("wsgi-file = site.wsgi")[0]
    assert "without module" in errors("callable = app")[0]


def test_placeholders_in_common_use_expand_as_uwsgi_expands_them():
    found = values("project = shop\nbase = /srv/%(project)\nchdir = %(base)\n"
                   "pidfile = %d%n.pid\nlogto = %(here)/%s.log\nsocket = $(RUN)/%c.sock\n"
                   "stats = %(base)/100%%.sock\n")
    assert found["chdir"] == "/srv/shop"
    assert found["pid"] == "/srv/shop/deploy/uwsgi.pid"
    assert found["error_logfile"] == "/srv/shop/deploy/uwsgi.ini.log"
    assert found["bind"] == ["uwsgi:unix:/run/shop/deploy.sock"]
    assert found["stats"] == "unix:/srv/shop/100%.sock"
    assert values("set-placeholder = app=shop\nmodule = %(app).wsgi")["app"] == \
        "shop.wsgi:application"
    assert values("chdir = %x-%e")["chdir"] == "uwsgi-ini"


def test_references_follow_uwsgi_s_passes():
    # %(name) is resolved after every line is read: forward, first definition wins
    assert values("chdir = %(base)/app\nbase = /srv\nbase = /other")["chdir"] == "/srv/app"
    assert values("one = %(two)\ntwo = /x\nchdir = %(one)/y")["chdir"] == "/x/y"  # nested
    # a placeholder's value is taken as written: uWSGI expands no $(ENV) in it
    assert values("set-ph = x=$(RUN)\nchdir = %(x)")["chdir"] == "$(RUN)"
    assert values("base = $(RUN)\nchdir = %(base)")["chdir"] == "/run/shop"
    assert values("chdir = $(NOPE:-/tmp)/a\npidfile = $(RUN-/x)/p")["chdir"] == "/tmp/a"
    assert values("pidfile = $(RUN-/x)/p")["pid"] == "/run/shop/p"
    assert "nest deeper" in errors("one = %(two)\ntwo = %(one)\nchdir = %(one)")[0]


def test_unsupported_placeholders_are_named():
    assert "placeholder %v is not supported" in errors("chdir = %v/app")[0]
    assert "placeholder %0 is not supported" in errors("chdir = /srv/%0")[0]
    assert "@(file://x)" in errors("chdir = @(file://x)")[0]
    assert "$(NOPE)" in errors("chdir = $(NOPE)/x")[0]
    assert "%(nowhere) names no option" in errors("chdir = %(nowhere)")[0]
    assert "set-placeholder: expected NAME=VALUE" in errors("set-placeholder = nothing")[0]
    # uWSGI leaves a log format's %(vars) alone; it is ignored here anyway
    assert not errors("log-format = %(addr) %(uri) %(status)")


def test_repeated_options_accumulate_or_replace_as_in_uwsgi():
    found = values("pythonpath = /a\npp = /b\nsocket = :1\nsocket = :2\nprocesses = 2\n"
                   "processes = 3")
    assert found == {"pythonpath": "/a,/b", "bind": ["uwsgi::1", "uwsgi::2"], "workers": 3}


def test_switches_that_change_nothing_are_warned_once_with_the_reason():
    result = translate("enable-threads = false\nthunder-lock\nsingle-interpreter = 0\n"
                       "enable-threads = false\nlazy-apps = true\nmaster = true\nvacuum = true\n"
                       "need-app\nstrict = true\n")
    assert not result.errors and result.values == {}
    assert [w.split(": ", 1)[1].split(" =")[0] for w in result.warnings] == [
        "enable-threads", "thunder-lock", "single-interpreter", "lazy-apps"]
    assert "line 3: thunder-lock = : ignored: no effect" in result.warnings[1]


def test_options_set_to_what_forkserve_does_anyway_are_silent():
    result = translate("lazy-apps = false\nlazy = no\nenable-threads\nsingle-interpreter = 1\n"
                       "log-master = true\noffload-threads = 0\nreuse-port = false\n"
                       "max-worker-lifetime = 0\nstats-http\n")
    assert not result.errors and result.warnings == []
    assert "lazy-apps = : ignored" in translate("lazy-apps").warnings[0]  # a switch alone: on


def test_gunicorn_and_uwsgi_values_that_ask_nothing_follow_one_rule():
    from forkserve.config import gunicorn
    assert gunicorn.translate("preload_app", True) == (None, None)
    assert gunicorn.translate("preload_app", "true") == (None, None)
    assert gunicorn.translate("preload_app", False)[1].startswith("preload_app = False has no")
    assert not translate("lazy-apps = off").warnings
    assert translate("lazy-apps = on").warnings


def test_reload_on_rss_says_once_that_private_memory_is_limited():
    result = translate("reload-on-rss = 300\nevil-reload-on-rss = 400")
    assert result.values == {"max_worker_memory": 400}
    assert len(result.warnings) == 1
    assert "not RSS" in result.warnings[0]


def test_die_on_term_and_master_off_are_warned_as_differences():
    assert "TERM reloads uWSGI" in translate("die-on-term = false").warnings[0]
    assert translate("die-on-term = true").warnings == []
    assert "always runs a master" in translate("master = false").warnings[0]
    assert "expected true or false" in errors("master = perhaps")[0]


def test_refused_options_stop_with_the_reason_and_unknown_ones_with_a_hint():
    problems = errors("static-map = /static=/srv/static\ndaemonize = /var/log/x\n"
                      "procesess = 4\nproject = shop\nchdir = /srv/%(project)\nfrobnicate = 1")
    assert len(problems) == 4
    assert "line 2: static-map is not supported by forkserve: forkserve serves the " \
           "application only" in problems[0]
    assert "daemonize is not supported" in problems[1]
    assert "unknown uWSGI option 'procesess': did you mean processes?" in problems[2]
    assert "unknown uWSGI option 'frobnicate'" in problems[3]  # project is a variable: fine


def test_bad_values_are_reported_with_their_line():
    problems = errors("processes = four\nsocket = @abstract\nsocket = =3\nchmod-socket = rw\n"
                      "env = NOVALUE\nprotocol = fastcgi")
    assert [p.split(":", 1)[0] for p in problems] == [f"uwsgi.ini line {n}" for n in range(2, 8)]


def test_no_uwsgi_section_is_an_error_and_other_sections_are_not_read():
    result = uwsgi.translate("[app:main]\nuse = egg:shop\n", "/x/a.ini", ENV)
    assert "has no [uwsgi] section" in result.errors[0]
    assert uwsgi.translate("[other]\nbogus = 1\n[uwsgi]\nprocesses = 2\n", "/x/a.ini",
                           ENV).values == {"workers": 2}


def test_chmod_socket_becomes_the_umask_that_gives_that_mode():
    assert values("chmod-socket = 660")["umask"] == "0o117"
    assert values("chmod-socket")["umask"] == "0o111"


# --- settings.parse reads an ini ---------------------------------------------------------

@pytest.fixture
def ini(tmp_path):
    path = tmp_path / "site.ini"
    path.write_text("[uwsgi]\nmodule = shop.wsgi\nprocesses = 3\nsocket = :3031\n"
                    "reload-on-rss = 100\n[other]\nprocesses = 9\n")
    return path


def test_ini_flag_reads_the_uwsgi_section_and_the_command_line_wins(ini, tmp_path):
    cfg = settings.parse(["--ini", str(ini), "-w", "5"], environ={}, cwd=str(tmp_path))
    assert (cfg.app, cfg.workers, cfg.bind) == ("shop.wsgi:application", 5, ["uwsgi::3031"])
    assert cfg.max_worker_memory == 100 and "not RSS" in cfg.warnings[0]
    assert cfg.sources["workers"] == "command line"
    cfg = settings.parse(["--ini", f"{ini}:other"], environ={}, cwd=str(tmp_path))
    assert cfg.workers == 9


def test_the_ini_can_come_from_the_environment(ini, tmp_path):
    cfg = settings.parse([], environ={"FORKSERVE_INI": str(ini)}, cwd=str(tmp_path))
    assert cfg.workers == 3 and cfg.config == str(ini)


def test_config_flag_recognises_an_ini_by_extension_or_section(ini, tmp_path):
    assert settings.parse(["-c", str(ini)], environ={}, cwd=str(tmp_path)).workers == 3
    renamed = tmp_path / "uwsgi.conf"
    renamed.write_text("# shop\n" + ini.read_text())
    assert settings.parse(["-c", str(renamed)], environ={}, cwd=str(tmp_path)).workers == 3


def test_ini_problems_are_all_in_one_error(tmp_path):
    path = tmp_path / "bad.ini"
    path.write_text("[uwsgi]\nprocesses = x\nstatic-map = a=b\nbogus = 1\n")
    with pytest.raises(settings.ConfigError) as caught:
        settings.parse(["--ini", str(path)], environ={}, cwd=str(tmp_path))
    assert len(str(caught.value).splitlines()) == 3, str(caught.value)  # one line each
    with pytest.raises(settings.ConfigError, match="one config file"):
        settings.parse(["--ini", str(path), "-c", str(path)], environ={}, cwd=str(tmp_path))


def test_the_environment_expands_from_the_environ_parse_is_given(tmp_path):
    path = tmp_path / "env.ini"
    path.write_text("[uwsgi]\nsocket = $(SOCKET_DIR)/app.sock\n")
    cfg = settings.parse(["--ini", str(path)], environ={"SOCKET_DIR": "/run/x"},
                         cwd=str(tmp_path))
    assert cfg.bind == ["uwsgi:unix:/run/x/app.sock"]
    assert os.environ.get("SOCKET_DIR") is None


# --- uWSGI's options as command-line flags -------------------------------------------------

def test_uwsgi_long_flags_are_split_from_forkserve_s_own():
    taken = settings._flag_names()
    rest, pairs = uwsgi.split_flags(
        ["--socket", ":3031", "--master", "--processes=4", "-w", "2", "--die-on-term", "false",
         "--enable-threads", "app:app", "--module", "shop.wsgi", "--max-requests", "10",
         "--chdir", "/srv", "--", "--socket"], taken)
    assert pairs == [("socket", ":3031"), ("master", "true"), ("processes", "4"),
                     ("die-on-term", "false"), ("enable-threads", "true"),
                     ("module", "shop.wsgi")]
    # forkserve's own flags (-w, --max-requests, --chdir) and what follows -- stay
    assert rest == ["-w", "2", "app:app", "--max-requests", "10", "--chdir", "/srv", "--",
                    "--socket"]


def test_a_uwsgi_command_line_runs_as_forkserve_settings(tmp_path):
    cfg = settings.parse(["--socket", "/run/a.sock", "--http-socket", ":8080", "--module",
                          "shop.wsgi", "--master", "--processes", "3", "--harakiri", "20",
                          "--enable-threads", "--thunder-lock", "-b", "127.0.0.1:9000"],
                         environ={},
                         cwd=str(tmp_path))
    assert cfg.app == "shop.wsgi:application" and cfg.workers == 3 and cfg.timeout == 20
    assert cfg.bind == ["127.0.0.1:9000", "uwsgi:unix:/run/a.sock", "http::8080"]
    assert any("harakiri = 20" in w for w in cfg.warnings)
    assert any("thunder-lock = true: ignored" in w for w in cfg.warnings)
    assert not any("enable-threads" in w for w in cfg.warnings)  # what forkserve does anyway


def test_uwsgi_flags_override_the_ini_and_their_problems_are_listed_together(ini, tmp_path):
    cfg = settings.parse(["--ini", str(ini), "--processes", "7"], environ={}, cwd=str(tmp_path))
    assert cfg.workers == 7 and cfg.sources["workers"] == "command line"
    with pytest.raises(settings.ConfigError) as caught:
        settings.parse(["--processes", "x", "--static-map", "/s=/srv", "--socket", "@a"],
                       environ={}, cwd=str(tmp_path))
    assert len(str(caught.value).splitlines()) == 3, str(caught.value)  # one line each
    assert "command line --static-map: static-map is not supported" in str(caught.value)


def test_bind_prefixes_name_each_listener_s_protocol():
    from forkserve.process import sockets
    assert sockets.split_protocol("uwsgi:unix:/run/a.sock") == ("uwsgi", "unix:/run/a.sock")
    assert sockets.split_protocol("http::8000") == ("http", ":8000")
    assert sockets.split_protocol("unix:/run/a.sock") == (None, "unix:/run/a.sock")
    assert sockets.parse_address("uwsgi:unix:/run/a.sock").target == "/run/a.sock"
    assert sockets.protocols(["uwsgi::1", "127.0.0.1:2", "http:[::1]:3"], "uwsgi", 3) == [
        "uwsgi", "uwsgi", "http"]
    assert sockets.protocols(["uwsgi::1"], "http", 2) == ["http", "http"]  # systemd's sockets
