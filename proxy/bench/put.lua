-- wrk script: PUT a body of BODY_BYTES bytes (default 16) with the fencing token from the
-- FENCE_TOKEN env var, if set.
wrk.method = "PUT"
wrk.body = string.rep("v", tonumber(os.getenv("BODY_BYTES") or "16"))
wrk.headers["Content-Type"] = "application/octet-stream"
local token = os.getenv("FENCE_TOKEN")
if token ~= nil and token ~= "" then
  wrk.headers["Fence-Token"] = token
end
