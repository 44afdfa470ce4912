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

Only the atoms the format names are computed: the default line costs a dict
of nine entries and one `%` per request.

Pure: `AccessFormat.line()` takes the request's facts and returns the line.
"""

import base64
import binascii
import os
import re
import time

__all__ = ["DEFAULT", "AccessFormat"]

DEFAULT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'

_ATOM = re.compile(r"%\(([^)]*)\)")
_MONTHS = (None, "Jan", "Feb", "Mar", "Apr", "May", "Jun",
           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _quoted(value):
    if not isinstance(value, str) or (value.isascii() and value.isprintable()
                                      and '"' not in value and "\\" not in value):
        return value
    return value.translate(_ESCAPES).encode("ascii", "backslashreplace").decode("ascii")


_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\",
            **{code: "\\x%02x" % code for code in [*range(32), 127]}}


def _user(environ):
    auth = environ.get("HTTP_AUTHORIZATION")
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
    """A compiled access_log_format."""

    def __init__(self, fmt=DEFAULT):
        self.format = fmt
        self.atoms = tuple(dict.fromkeys(_ATOM.findall(fmt)))
        try:
            fmt % {atom: "-" for atom in self.atoms}
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"access_log_format {fmt!r} is not a valid %-format: {exc}; "
                             "write atoms as %(h)s") from None

    def line(self, environ, request_line, status, response_headers, sent, seconds,
             now=None) -> str:
        """The log line for one request.

        `response_headers` are (name, value) pairs (str or latin-1 bytes),
        `sent` the body bytes sent (None if no response), `seconds` how long
        the request took, `now` the wall-clock time (default: now).
        """
        values = {}
        for atom in self.atoms:
            values[atom] = _quoted(self._atom(atom, environ, request_line, status,
                                              response_headers, sent, seconds, now))
        return self.format % values

    @staticmethod
    def _atom(atom, environ, request_line, status, response_headers, sent, seconds, now):
        if atom == "h":
            return environ.get("REMOTE_ADDR", "-")
        if atom == "l":
            return "-"
        if atom == "u":
            return _user(environ)
        if atom == "t":
            return _now(now)
        if atom == "r":
            return request_line
        if atom == "s":
            return str(status) if status else "-"
        if atom in ("m", "U", "q", "H", "f", "a"):
            key = {"m": "REQUEST_METHOD", "U": "PATH_INFO", "q": "QUERY_STRING",
                   "H": "SERVER_PROTOCOL", "f": "HTTP_REFERER", "a": "HTTP_USER_AGENT"}[atom]
            return environ.get(key, "-")
        if atom == "b":
            return "-" if sent is None else str(sent)
        if atom == "B":
            return sent
        if atom in ("T", "D", "M", "L"):
            whole = int(seconds)
            micros = int(round((seconds - whole) * 1e6))
            if micros == 1000000:
                whole, micros = whole + 1, 0
            return {"T": whole, "D": whole * 1000000 + micros,
                    "M": whole * 1000 + micros // 1000, "L": "%d.%06d" % (whole, micros)}[atom]
        if atom == "p":
            return "<%d>" % os.getpid()
        if atom.startswith("{") and len(atom) > 3 and atom[-2] == "}":
            name, kind = atom[1:-2].lower(), atom[-1].lower()
            if kind == "i":
                return _request_header(environ, name)
            if kind == "o":
                return _response_header(response_headers, name)
            if kind == "e":
                for key, value in environ.items():
                    if key.lower() == name:
                        return value
        return "-"


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
