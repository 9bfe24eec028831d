-- wrk script: PUT a small value with the fencing token from the FENCE_TOKEN env var.
wrk.method = "PUT"
wrk.body = "value-0123456789"
wrk.headers["Content-Type"] = "text/plain"
local token = os.getenv("FENCE_TOKEN")
if token ~= nil and token ~= "" then
  wrk.headers["Fence-Token"] = token
end
