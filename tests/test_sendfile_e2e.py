"""Issue 22 item 7: the sendfile setting, both ways. A file sent by the
kernel's sendfile() is never read() by the server; with sendfile off it is
read in blocks. The application counts its file's read() calls."""

import http.client

import pytest

pytestmark = pytest.mark.e2e

CONTENT = bytes(range(256)) * 1024  # 256 KiB: several 64 KiB blocks when read


@pytest.fixture
def sent_file(tmp_path):
    path = tmp_path / "sent.bin"
    path.write_bytes(CONTENT)
    return {"SENT_FILE": str(path)}


def _served_reads(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/file")
        response = connection.getresponse()
        assert response.status == 200 and response.read() == CONTENT
    finally:
        connection.close()
    status, reads = server.request("GET", "/reads")
    assert status == 200
    return int(reads)


def test_files_go_out_with_sendfile_by_default(run_server, sent_file):
    assert _served_reads(run_server("-w", "0", app="file_sender:app", env=sent_file)) == 0


@pytest.mark.parametrize("how", ["--no-sendfile", "environment", "config file"])
def test_sendfile_off_reads_the_file_in_blocks(run_server, tmp_path, sent_file, how):
    args, env = ["-w", "0"], dict(sent_file)
    if how == "--no-sendfile":
        args.append("--no-sendfile")
    elif how == "environment":
        env["FORKSERVE_SENDFILE"] = "false"
    elif how == "config file":
        conf = tmp_path / "gunicorn.conf.py"
        conf.write_text("sendfile = False\n")
        args += ["-c", str(conf)]
    reads = _served_reads(run_server(*args, app="file_sender:app", env=env))
    assert reads >= len(CONTENT) // 65536, reads
