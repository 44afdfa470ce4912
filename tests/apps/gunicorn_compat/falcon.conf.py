# Behind a load balancer on another host that says X-Scheme: https, with a
# JSON-ish access line that names the request id.
import os  # noqa: F401  (imports are the file's own, not settings)

workers = 1
forwarded_allow_ips = "*"
secure_scheme_headers = {"X-SCHEME": "https"}
access_log_format = '{"ip": "%(h)s", "request": "%(r)s", "status": %(s)s, "id": "%({x-request-id}i)s", "scheme": "%({wsgi.url_scheme}e)s"}'
