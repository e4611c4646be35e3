--- `--plots DIR` for the notebook ports (scripts/examples/seeds/): each attention-weight
-- matrix a port prints is also written as an SVG heatmap into DIR, named
-- `<port number>_<NN>_<what>.svg` in print order (002_07_causal_attn_weights.svg).
--
--   local plots = require("seed_plots").from_args(arg, "002")
--   print(attn_weights); plots:weights("attn_weights", attn_weights, tokens)
--
-- Without `--plots` every call does nothing, so the ports print the same text
-- either way (scripts/examples/check_seeds.lua compares that text).
local viz = require "attn.viz"

local M = {}
local Plots = {}
Plots.__index = Plots

local function usage(script, msg)
  io.stderr:write(script .. ": " .. msg .. "\nusage: scripts/attn-lua " .. script .. " [--plots DIR]\n")
  os.exit(2)
end

--- The plotter for a port's command-line arguments (`arg`).
-- @param args the script's `arg` table
-- @param script the script's name, for messages
function M.from_args(args, script)
  local self = setmetatable({ dir = nil, count = 0, script = script }, Plots)
  local i = 1
  while args and i <= #args do
    local a = args[i]
    if a == "--plots" then
      self.dir = args[i + 1]
      if not self.dir or self.dir == "" then usage(script, "--plots needs a directory") end
      i = i + 2
    elseif a:match("^%-%-plots=") then
      self.dir = a:sub(9)
      i = i + 1
    else
      usage(script, "unknown argument '" .. a .. "'")
    end
  end
  if self.dir then
    local ok = os.execute("mkdir -p '" .. self.dir:gsub("'", "'\\''") .. "'")
    if not ok then usage(script, "cannot create directory " .. self.dir) end
  end
  return self
end

--- Write a heatmap of `w` ([Lk] for one query, [Lq, Lk], [heads, Lq, Lk] or
-- [b, heads, Lq, Lk]); `rows`/`cols` label the queries and keys.
function Plots:weights(name, w, rows, cols, title)
  if not self.dir then return end
  self.count = self.count + 1
  local prefix = self.script:match("([^/]*)%.lua$"):match("^%d+") or "plot"
  local file = string.format("%s/%s_%02d_%s.svg", self.dir, prefix, self.count, name)
  cols = cols or rows
  local opts = { file = file, title = title or name, rows = rows, cols = cols }
  if w:dim() == 1 then
    opts.rows = { title or name }
    viz.heatmap(w:unsqueeze(1), opts)
  elseif w:dim() == 2 then
    viz.heatmap(w, opts)
  else
    viz.heads(w, opts)
  end
  io.stderr:write("wrote " .. file .. "\n")
end

--- Say so when a port prints no attention-weight matrix (only outputs).
function Plots:none()
  if self.dir then
    io.stderr:write(self.script .. ": this notebook prints no attention-weight matrix; nothing written to "
      .. self.dir .. "\n")
  end
end

return M
