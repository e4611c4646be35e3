--- attn.nn.FeedForward(cfg): the book's chapter 4 feed-forward block,
-- `layers` = Sequential(Linear(emb_dim, 4 emb_dim), GELU("tanh"),
-- Linear(4 emb_dim, emb_dim)); parameters `layers.0.weight`, `layers.0.bias`,
-- `layers.2.weight`, `layers.2.bias`, drawn in that order as torch does.
-- cfg needs `emb_dim` (see nn.GPTModel for the whole config).
-- @classmod attn.nn.FeedForward
local Module = require "attn.nn.Module"
local caller = require "attn.caller"
local Linear = require "attn.nn.Linear"
local GELU = require "attn.nn.GELU"
local Sequential = require "attn.nn.Sequential"
local checks = require "attn.nn.checks"

local FeedForward = Module:extend("FeedForward")

function FeedForward:init(cfg)
  if type(cfg) ~= "table" then
    caller.error(("attn.nn.FeedForward: bad argument #1 'cfg' (expected a table with emb_dim, got %s)"):format(type(cfg)))
  end
  local d = checks.positive_integer("FeedForward", cfg.emb_dim, 1, "cfg.emb_dim")
  self.emb_dim = d
  self:add_module("layers", Sequential(Linear(d, 4 * d), GELU({approximate = "tanh"}), Linear(4 * d, d)))
end

--- x [..., emb_dim] -> [..., emb_dim].
function FeedForward:forward(x)
  return self.layers(x)
end

return FeedForward
