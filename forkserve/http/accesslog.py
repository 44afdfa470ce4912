"""Access log lines in Gunicorn's format (its `access_log_format` setting).

The atoms, as Gunicorn defines them:

  h remote address      l '-'                 u user (HTTP Basic) or '-'
  t [10/Oct/2000:13:55:36 -0700]              r request line
  m method              U path (no query)     q query string
  H protocol            s status              B body bytes sent
  b body bytes or '-'   f referer             a user agent
  T seconds (whole)     D microseconds        M milliseconds
  L seconds (decimal)   p <pid>
  {name}i request header   {name}o response header   {name}e environ variable

As in Gunicorn, an atom the request lacks is '-', a double quote in a value
is written as \\", and header and environ names are matched without regard to
case. Unlike Gunicorn, a backslash is written as \\\\ and any other byte
that is not printable ASCII as \\xNN (as Apache does), so a client cannot
forge a line or a field; for printable text the lines are the same.

Only the atoms the format names are computed. Gunicorn's default format,
what nearly everyone logs, has its own path: capture() takes the values into
a tuple while the request runs, render() makes the line with one f-string
and a check made of str methods, and forkserve's log file renders the lines it
holds in one batch when it writes them (logs.AccessFileHandler): 1.7-2.2 us
per request in a worker, against 2.6 us for the same f-string amid each
request and 4 us for the earlier per-request % formatting
(benchmarks/README.md, "What the access log costs").

Pure: `AccessFormat.line()` takes the request's facts and returns the line;
`capture()` and `AccessFormat.render()` are the same in two steps.
"""

import base64
import binascii
import os
import re
import time

__all__ = ["DEFAULT", "AccessFormat", "capture"]

DEFAULT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'
_DEFAULT_QUOTES = DEFAULT.count('"')

_ATOM = re.compile(r"%\(([^)]*)\)")
_MONTHS = (None, "Jan", "Feb", "Mar", "Apr", "May", "Jun",
           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _quoted(value):
    return value.translate(_ESCAPES).encode("ascii", "backslashreplace").decode("ascii")


#: finds a character a log value cannot hold as is: not printable ASCII, '"' or '\\'
_NEEDS_ESCAPE = re.compile(r'[^\x20\x21\x23-\x5b\x5d-\x7e]').search

_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\",
            **{code: "\\x%02x" % code for code in [*range(32), 127]}}


def _user(auth):
    """The user name of an Authorization: Basic header, or '-'."""
    if not auth or not auth.lower().startswith("basic"):
        return "-"
    parts = auth.split(" ", 1)
    if len(parts) != 2:
        return "-"
    try:
        return base64.b64decode(parts[1].strip().encode()).split(b":", 1)[0].decode() or "-"
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return "-"


def _now(seconds=None):
    now = time.localtime(seconds)
    return "[%02d/%s/%d:%02d:%02d:%02d %s]" % (
        now.tm_mday, _MONTHS[now.tm_mon], now.tm_year, now.tm_hour, now.tm_min, now.tm_sec,
        time.strftime("%z", now))


class AccessFormat:
    """A compiled access_log_format: one small function per atom it names."""

    def __init__(self, fmt=DEFAULT):
        self.format = fmt
        self.atoms = tuple(dict.fromkeys(_ATOM.findall(fmt)))
        try:
            fmt % {atom: "-" for atom in self.atoms}
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"access_log_format {fmt!r} is not a valid %-format: {exc}; "
                             "write atoms as %(h)s") from None
        self._getters = tuple((atom, _getter(atom)) for atom in self.atoms)
        self._stamp = (None, "")
        #: DEFAULT can be captured now (capture()) and rendered later (render_all())
        self.deferrable = fmt == DEFAULT
        if self.deferrable:
            self.line = self._default_line

    def line(self, environ, request_line, status, response_headers, sent, seconds,
             now=None) -> str:
        """The log line for one request.

        `response_headers` are (name, value) pairs (str or latin-1 bytes),
        `sent` the body bytes sent (None if no response), `seconds` how long
        the request took, `now` the wall-clock time (default: now).
        """
        return self._any_line(environ, request_line, status, response_headers, sent, seconds,
                              now)

    def _default_line(self, environ, request_line, status, response_headers, sent, seconds,
                      now=None):
        return self.render(capture(environ, request_line, status, sent, now))

    def render(self, captured):
        """The DEFAULT line from capture()'s tuple: no dict.

        The line is kept only if it is printable ASCII with no backslash and
        no double quote besides the format's own; otherwise a value needs
        escaping and the general path makes the line.
        """
        line = self._lines((captured,))[0]
        if _plain(line, 1):
            return line
        address, auth, now, request_line, status, sent, referer, agent = captured
        environ = {"REMOTE_ADDR": address, "HTTP_REFERER": referer, "HTTP_USER_AGENT": agent}
        if auth:
            environ["HTTP_AUTHORIZATION"] = auth
        return self._any_line(environ, request_line, status, (), sent, 0.0, now)

    def render_all(self, entries):
        """The lines of a list of entries: capture() tuples, or lines (str)
        made already. Same lines as render() of each, with the check made
        once over the whole block, which nearly always passes."""
        if any(entry.__class__ is str for entry in entries):
            return [entry if entry.__class__ is str else self.render(entry)
                    for entry in entries]
        lines = self._lines(entries)
        if _plain("".join(lines), len(lines)):
            return lines
        return [self.render(captured) for captured in entries]

    def _lines(self, entries):
        """DEFAULT's lines of capture() tuples, unchecked (one f-string each:
        half the time of the same `%`)."""
        stamp = self.stamp
        return [f'{address} - {_user(auth) if auth else "-"} {stamp(now)} "{request_line}" '
                f'{status or "-"} {"-" if sent is None else sent} "{referer}" "{agent}"'
                for address, auth, now, request_line, status, sent, referer, agent in entries]

    def _any_line(self, environ, request_line, status, response_headers, sent, seconds, now):
        facts = (environ, request_line, status, response_headers, sent, seconds, now, self)
        values = {atom: getter(facts) for atom, getter in self._getters}
        texts = [value for value in values.values() if value.__class__ is str]
        if _NEEDS_ESCAPE("".join(texts)) is not None:  # one scan; rarely true
            for atom, value in values.items():
                if value.__class__ is str and _NEEDS_ESCAPE(value) is not None:
                    values[atom] = _quoted(value)
        return self.format % values

    def stamp(self, now):
        """[day/Mon/year:H:M:S zone], formatted once per second."""
        second = int(time.time() if now is None else now)
        if self._stamp[0] != second:
            self._stamp = (second, _now(second))
        return self._stamp[1]


def _plain(text, lines):
    """True if `text`, `lines` DEFAULT lines joined, needs no escaping:
    printable ASCII, no backslash, no double quote besides the format's."""
    return (text.isascii() and text.isprintable() and "\\" not in text
            and text.count('"') == _DEFAULT_QUOTES * lines)


def capture(environ, request_line, status, sent, now=None):
    """What the DEFAULT line needs, as a tuple of values the request already
    holds (nothing formatted): AccessFormat.render() makes the line later. A
    log that renders lines in batches pays less per request than one that
    formats each line amid the request's work."""
    get = environ.get
    return (get("REMOTE_ADDR", "-"), get("HTTP_AUTHORIZATION"),
            time.time() if now is None else now, request_line, status, sent,
            get("HTTP_REFERER", "-"), get("HTTP_USER_AGENT", "-"))


def _environ(key):
    return lambda facts: facts[0].get(key, "-")


def _seconds(facts):
    seconds = facts[5]
    whole = int(seconds)
    micros = int(round((seconds - whole) * 1e6))
    return (whole + 1, 0) if micros == 1000000 else (whole, micros)


_GETTERS = {
    "h": _environ("REMOTE_ADDR"),
    "l": lambda facts: "-",
    "u": lambda facts: _user(facts[0].get("HTTP_AUTHORIZATION")),
    "t": lambda facts: facts[7].stamp(facts[6]),
    "r": lambda facts: facts[1],
    "m": _environ("REQUEST_METHOD"),
    "U": _environ("PATH_INFO"),
    "q": _environ("QUERY_STRING"),
    "H": _environ("SERVER_PROTOCOL"),
    "f": _environ("HTTP_REFERER"),
    "a": _environ("HTTP_USER_AGENT"),
    "s": lambda facts: str(facts[2]) if facts[2] else "-",
    "b": lambda facts: "-" if facts[4] is None else str(facts[4]),
    "B": lambda facts: facts[4],
    "T": lambda facts: _seconds(facts)[0],
    "D": lambda facts: (lambda whole, micros: whole * 1000000 + micros)(*_seconds(facts)),
    "M": lambda facts: (lambda whole, micros: whole * 1000 + micros // 1000)(*_seconds(facts)),
    "L": lambda facts: "%d.%06d" % _seconds(facts),
    "p": lambda facts: "<%d>" % os.getpid(),
}


def _getter(atom):
    if atom in _GETTERS:
        return _GETTERS[atom]
    if atom.startswith("{") and len(atom) > 3 and atom[-2] == "}":
        name, kind = atom[1:-2].lower(), atom[-1].lower()
        if kind == "i":
            return lambda facts: _request_header(facts[0], name)
        if kind == "o":
            return lambda facts: _response_header(facts[3], name)
        if kind == "e":
            return lambda facts: next((value for key, value in facts[0].items()
                                       if key.lower() == name), "-")
    return lambda facts: "-"


def _request_header(environ, name):
    key = name.upper().replace("-", "_")
    if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        return environ.get(key, "-")
    return environ.get("HTTP_" + key, "-")


def _response_header(headers, name):
    found = "-"  # the last one, as Gunicorn
    for key, value in headers or ():
        if isinstance(key, bytes):
            key, value = key.decode("latin-1"), value.decode("latin-1")
        if key.lower() == name:
            found = value
    return found
