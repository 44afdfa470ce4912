-- wrk script: random PersonDB lookups, a fixed number per thread.
--
--   BENCH_EMAILS=emails.txt BENCH_QUOTA=100000 wrk -t1 -c32 -d120s \
--       -s benchmarks/apps/lookup.lua http://127.0.0.1:PORT
--
-- Environment:
--   BENCH_EMAILS      file of known emails, one per line (required)
--   BENCH_QUOTA       responses per thread, then the thread stops (0 = none)
--   BENCH_DONE        path prefix; thread N creates "<prefix>N" when done,
--                     so the harness can end wrk's -d wait early (wrk
--                     itself always sleeps for the whole -d)
--   BENCH_MISS_RATIO  share of lookups for unknown people, answered 404
--   BENCH_CLOSE_RATIO share of requests sent with "Connection: close", so
--                     connections are re-accepted now and then and spread
--                     over a pre-fork server's workers as in production
--   BENCH_SEED        random seed (thread N uses seed + N)
--
-- done() prints one line "BENCH_RESULT {json}" with the counters and
-- latency percentiles (microseconds) that benchmarks/harness/wrk.py reads.

local thread_list = {}
local next_id = 1

function setup(thread)
   thread:set("id", next_id)
   next_id = next_id + 1
   table.insert(thread_list, thread)
end

function init(args)
   local path = os.getenv("BENCH_EMAILS")
   emails = {}
   for line in io.lines(path) do
      emails[#emails + 1] = line
   end
   if #emails == 0 then
      error("BENCH_EMAILS " .. path .. " has no emails")
   end
   quota = tonumber(os.getenv("BENCH_QUOTA") or "0")
   done_prefix = os.getenv("BENCH_DONE")
   miss_ratio = tonumber(os.getenv("BENCH_MISS_RATIO") or "0.05")
   close_ratio = tonumber(os.getenv("BENCH_CLOSE_RATIO") or "0.02")
   math.randomseed(tonumber(os.getenv("BENCH_SEED") or "1") + id)
   sent, ok, missing, other, closes = 0, 0, 0, 0, 0
   finished = false
end

function request()
   sent = sent + 1
   local path
   if math.random() < miss_ratio then
      path = "/person/nobody." .. id .. "." .. sent .. "@unknown.invalid"
   else
      path = "/person/" .. emails[math.random(#emails)]
   end
   if math.random() < close_ratio then
      closes = closes + 1
      return wrk.format("GET", path, {["Connection"] = "close"})
   end
   return wrk.format("GET", path)
end

function response(status, headers, body)
   if status == 200 then
      ok = ok + 1
   elseif status == 404 then
      missing = missing + 1
   else
      other = other + 1
   end
   if quota > 0 and not finished and ok + missing + other >= quota then
      finished = true
      if done_prefix then
         local f = io.open(done_prefix .. id, "w")
         if f then f:close() end
      end
      wrk.thread:stop()
   end
end

function done(summary, latency, requests)
   local ok_t, missing_t, other_t, closes_t = 0, 0, 0, 0
   for _, t in ipairs(thread_list) do
      ok_t = ok_t + (t:get("ok") or 0)
      missing_t = missing_t + (t:get("missing") or 0)
      other_t = other_t + (t:get("other") or 0)
      closes_t = closes_t + (t:get("closes") or 0)
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH_RESULT {"requests": %d, "duration_us": %d, "ok": %d, ' ..
      '"not_found": %d, "bad_status": %d, "closes": %d, ' ..
      '"connect_errors": %d, "read_errors": %d, "write_errors": %d, ' ..
      '"timeouts": %d, "status_errors": %d, ' ..
      '"p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d, ' ..
      '"max_us": %d, "mean_us": %.1f}\n',
      summary.requests, summary.duration, ok_t, missing_t, other_t, closes_t,
      e.connect, e.read, e.write, e.timeout, e.status,
      latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9),
      latency.max, latency.mean))
end
