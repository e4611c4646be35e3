-- The failure path: rank `failing` (arg 1, default 2) raises while the other
-- ranks wait in an all_reduce it never joins; attn-lua must end the job.
package.path = arg[0]:match("^(.*/)") .. "?.lua;" .. package.path
local attn = require "attn"
local dist = require "attn.dist"
local check = require "check"

local r = check.start()
local failing = tonumber((...)) or 2
io.stdout:write(("rank %d started\n"):format(r))
io.stdout:flush()
if r == failing then error("spec failure on purpose") end
dist.all_reduce(attn.zeros(4))
io.stdout:write(("rank %d passed the all_reduce\n"):format(r))
