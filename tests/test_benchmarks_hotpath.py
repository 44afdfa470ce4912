"""benchmarks/hotpath.py's pure parts: the tools' outputs and the categories."""

from benchmarks import hotpath

SEND = "Transport.send (forkserve/http/transport.py:78)"
SENDING = "send: write(2) in Transport.send (gevent sendall for a short write)"
OUTER = ("_handle_and_close_when_done (gevent/baseserver.py:34);"
         "Server.handle (forkserve/http/server.py:120);"
         "Handler.handle (forkserve/http/handler.py:79);"
         "Handler._next_request (forkserve/http/handler.py:93)")


def test_a_sample_goes_to_its_innermost_matching_frame():
    sending = OUTER.split(";") + ["Responder.respond (forkserve/http/responder.py:85)",
                                  "Responder._send_head (forkserve/http/responder.py:134)", SEND]
    assert hotpath.categorize(sending) == SENDING
    parsing = OUTER.split(";") + ["Connection._head_line (forkserve/http/protocol.py:174)",
                                  "request_line (forkserve/http/h1.py:137)"]
    assert hotpath.categorize(parsing) == "request line + header grammar (h1.py)"
    assert hotpath.categorize(["<module> (x.py:1)"]) == hotpath.OTHER


def test_py_spy_raw_lines_become_category_shares():
    text = f"{OUTER};{SEND} 3\n{OUTER};request_line (forkserve/http/h1.py:137) 1\n"
    samples = hotpath.parse_pyspy_raw(text)
    assert [count for _, count in samples] == [3, 1]
    shares = hotpath.category_shares(samples)
    assert shares == {SENDING: 0.75,
                      "request line + header grammar (h1.py)": 0.25}
    assert hotpath.leaf_shares(samples)[0] == (SEND, 0.75)


def test_strace_and_perf_stat_counts_are_read():
    strace = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 60.00    0.006000           3      2000           sendto
 40.00    0.004000           2      2000       500 recvfrom
------ ----------- ----------- --------- --------- ----------------
100.00    0.010000           2      4000       500 total
"""
    assert hotpath.parse_strace_summary(strace) == {"sendto": (2000, 0),
                                                    "recvfrom": (2000, 500)}
    perf = ("# started on x\n\n2011,,syscalls:sys_enter_sendto,100,100.00,,\n"
            "0,,syscalls:sys_enter_read,100,100.00,,\n"
            "<not counted>,,syscalls:sys_enter_open,0,0.00,,\n")
    assert hotpath.parse_perf_stat_syscalls(perf) == {"sendto": (2011, None),
                                                      "read": (0, None)}


def test_parser_micro_parses_both_heads_with_h1():
    from benchmarks import parser_micro

    wrk = parser_micro.parse_h1(parser_micro.HEADS["wrk"])
    assert wrk == [("GET", "/", "HTTP/1.1", "GET / HTTP/1.1"), ("Host", "127.0.0.1:8000")]
    browser = parser_micro.parse_h1(parser_micro.HEADS["browser"])
    assert len(browser) == 11 and browser[-1] == ("Sec-Fetch-Mode", "navigate")
