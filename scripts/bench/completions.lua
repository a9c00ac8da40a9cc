-- wrk script for the HTTP load test of `octoflow serve` (docs/PERFORMANCE.md):
--   wrk -t8 -c64 -d30s --latency -s scripts/bench/completions.lua http://127.0.0.1:8080
-- Every request asks for a greedy completion of a short prompt; MAX_TOKENS sets its length.
local max_tokens = tonumber(os.getenv("MAX_TOKENS") or "128")
wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = string.format(
  '{"prompt":"Write a short story about a robot who learns to paint.","max_tokens":%d,"temperature":0,"ignore_eos":true}',
  max_tokens)

local errors = 0
response = function(status, headers, body)
  if status ~= 200 then
    errors = errors + 1
    if errors <= 3 then io.stderr:write("status " .. status .. ": " .. body .. "\n") end
  end
end
