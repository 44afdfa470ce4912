"""The deploy tests' nginx requirement: skipped on a laptop, failed in CI."""

import pytest

import deploy_cluster


@pytest.fixture
def no_nginx(monkeypatch):
    monkeypatch.setattr(deploy_cluster, "nginx_binary", lambda: None)


def test_missing_nginx_skips_with_how_to_install_it(no_nginx, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install -y nginx"):
        deploy_cluster.require_nginx(pytest)


def test_missing_nginx_fails_in_ci_with_the_same_message(no_nginx, monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y nginx"):
        deploy_cluster.require_nginx(pytest)
