"""Issue 22 item 7: the sendfile setting, both ways. A file sent by the
kernel's sendfile() is never read() by the server; with sendfile off it is
read in blocks. The application counts its file's read() calls."""

import http.client
import socket

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


#: a 12 TiB sparse file's length: its decimal needs 14 digits, past the
#: 32-byte buffer the C head builder once wrote the Content-Length line in
TWELVE_TIB = 12 << 40


@pytest.mark.parametrize("method", ["HEAD", "GET"])
@pytest.mark.parametrize("head_path", ["c", "python"])
def test_a_12_tib_sparse_file_s_head_says_its_whole_length(run_server, tmp_path, head_path,
                                                          method):
    """The length taken from the file, in the C head builder or the Python
    one (FORKSERVE_NO_C): the whole number, no NUL byte. GET reads the head
    and a few bytes of the body, then closes."""
    sparse = tmp_path / "sparse.bin"
    with open(sparse, "wb") as file:
        file.truncate(TWELVE_TIB)
    env = {"SENT_FILE": str(sparse)}
    if head_path == "python":
        env["FORKSERVE_NO_C"] = "1"
    server = run_server("-w", "0", app="file_sender:app", env=env)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(f"{method} /file HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = client.recv(65536)
            assert chunk, f"closed before the head's end: {received!r}"
            received += chunk
    head = received.partition(b"\r\n\r\n")[0] + b"\r\n"
    assert b"\x00" not in head, head
    assert b"\r\nContent-Length: 13194139533312\r\n" in head, head
