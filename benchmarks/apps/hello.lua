-- wrk script for benchmarks/hello.py: GET / on keep-alive connections (or
-- a connection per request, BENCH_CLOSE=1), and
-- one line "BENCH_RESULT {json}" at the end with the counters and latency
-- percentiles (microseconds), in lookup.lua's format
-- (benchmarks/harness/wrk.py's parse_result reads both). wrk keeps
-- every latency sample at microsecond resolution, so p99.9 is exact for
-- the run (not sampled).

-- BENCH_CLOSE=1: every request says "Connection: close" (a connection per
-- request, as nginx's default proxy_pass opens them)
if os.getenv("BENCH_CLOSE") == "1" then
   wrk.headers["Connection"] = "close"
end

local counts = {}

-- BENCH_CLOSE=1: every request asks for Connection: close, so each one is a
-- new connection (over TLS, a full handshake: benchmarks/throughput.py's tls-close)
if os.getenv("BENCH_CLOSE") == "1" then
   wrk.headers["Connection"] = "close"
end

function setup(thread)
   table.insert(counts, thread)
end

function init(args)
   ok, other = 0, 0
end

function response(status, headers, body)
   if status == 200 then ok = ok + 1 else other = other + 1 end
end

function done(summary, latency, requests)
   local ok_t, other_t = 0, 0
   for _, t in ipairs(counts) do
      ok_t = ok_t + (t:get("ok") or 0)
      other_t = other_t + (t:get("other") or 0)
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH_RESULT {"requests": %d, "duration_us": %d, "ok": %d, "not_found": 0, ' ..
      '"bad_status": %d, "connect_errors": %d, "read_errors": %d, "write_errors": %d, ' ..
      '"timeouts": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d, ' ..
      '"max_us": %d, "mean_us": %.1f}\n',
      summary.requests, summary.duration, ok_t, other_t,
      e.connect, e.read, e.write, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99),
      latency:percentile(99.9),
      latency.max, latency.mean))
end
