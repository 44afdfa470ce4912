"""Settings: declared once, parsed from flags, environment and config files."""

import pathlib
import re

import pytest

from forkserve.config import settings
from forkserve.config.settings import ConfigError, parse

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_defaults_apply_when_nothing_is_given(tmp_path):
    cfg = parse(["app:app"], environ={}, cwd=str(tmp_path))
    assert cfg.app == "app:app"
    assert cfg.bind == ["127.0.0.1:8000"]
    assert cfg.workers >= 1
    assert cfg.timeout == 30.0 and cfg.max_requests == 0
    assert cfg.sources["workers"] == "default"


def test_command_line_beats_environment_beats_config_file(tmp_path):
    config = tmp_path / "conf.toml"
    config.write_text("workers = 7\ntimeout = 9\nkeep-alive = 3\n")
    environ = {"FORKSERVE_WORKERS": "5", "FORKSERVE_TIMEOUT": "8"}
    cfg = parse(["-c", str(config), "-w", "2", "a:b"], environ=environ, cwd=str(tmp_path))
    assert (cfg.workers, cfg.timeout, cfg.keep_alive) == (2, 8.0, 3.0)
    assert cfg.sources["workers"] == "command line"
    assert cfg.sources["timeout"] == "environment FORKSERVE_TIMEOUT"
    assert cfg.sources["keep_alive"].startswith("config file")


def test_bind_repeats_and_port_zero_is_allowed(tmp_path):
    cfg = parse(["-b", "127.0.0.1:0", "-b", "unix:/tmp/x.sock", "a:b"], environ={},
                cwd=str(tmp_path))
    assert cfg.bind == ["127.0.0.1:0", "unix:/tmp/x.sock"]


def test_pyproject_table_is_read_and_app_can_be_set_there(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.forkserve]\napp = "svc:app"\nworkers = 0\n')
    cfg = parse(["-c", str(tmp_path / "pyproject.toml")], environ={}, cwd=str(tmp_path))
    assert cfg.app == "svc:app" and cfg.workers == 0


def test_pyproject_without_a_forkserve_table_is_an_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(ConfigError, match=r"no \[tool.forkserve\] table"):
        parse(["-c", str(tmp_path / "pyproject.toml"), "a:b"], environ={}, cwd=str(tmp_path))


def test_python_config_file_in_the_working_directory_is_read_by_default(tmp_path):
    (tmp_path / "forkserve.conf.py").write_text("workers = 3\nbind = ['127.0.0.1:0']\n")
    cfg = parse(["a:b"], environ={}, cwd=str(tmp_path))
    assert cfg.workers == 3 and cfg.bind == ["127.0.0.1:0"]


@pytest.mark.parametrize("argv, message", [
    (["-w", "-1"], "--workers (workers): expected a whole number >= 0, got -1"),
    (["--timeout", "soon"], "--timeout (timeout): expected a number of seconds"),
    (["--log-level", "loud"], "--log-level (log_level): expected one of debug"),
    (["--max-requests", "1.5"], "--max-requests (max_requests): expected a whole number"),
])
def test_bad_values_say_which_setting_and_why(tmp_path, argv, message):
    with pytest.raises(ConfigError) as caught:
        parse([*argv, "a:b"], environ={}, cwd=str(tmp_path))
    assert message in str(caught.value)


def test_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError, match="environment FORKSERVE_WORKERS"):
        parse(["a:b"], environ={"FORKSERVE_WORKERS": "x"}, cwd=str(tmp_path))


def test_unknown_toml_key_suggests_the_right_one(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("max_request = 5\n")
    with pytest.raises(ConfigError, match="did you mean 'max_requests'"):
        parse(["-c", str(config), "a:b"], environ={}, cwd=str(tmp_path))


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        parse(["-c", str(tmp_path / "nope.py"), "a:b"], environ={}, cwd=str(tmp_path))


def test_every_setting_has_a_flag_an_env_var_and_help():
    names = set()
    for setting in settings.SETTINGS:
        assert setting.flags and all(flag.startswith("-") for flag in setting.flags)
        assert setting.env == "FORKSERVE_" + setting.name.upper()
        assert setting.help.strip()
        assert setting.name not in names
        names.add(setting.name)


def test_docs_settings_table_is_generated_from_the_declarations():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert settings.settings_table() in page, (
        "docs/settings.md's table is stale: paste in the output of "
        "python -m forkserve.config.settings")


def test_warmup_paths_come_space_separated_from_the_environment_and_start_with_a_slash():
    cfg = settings.parse(["app:app"], environ={"FORKSERVE_WARMUP": "/ /products?page=2,3"})
    assert cfg.warmup == ["/", "/products?page=2,3"]
    assert settings.parse(["--warmup", "/a", "--warmup", "/b", "app:app"], environ={}).warmup \
        == ["/a", "/b"]
    with pytest.raises(settings.ConfigError, match="'products' is not a URL path"):
        settings.parse(["--warmup", "products", "app:app"], environ={})
