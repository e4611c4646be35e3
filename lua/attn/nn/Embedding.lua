--- attn.nn.Embedding(num_embeddings, embedding_dim): a lookup table of
-- `weight` [num_embeddings, embedding_dim], drawn from N(0, 1) as
-- torch.nn.Embedding does (weight.normal_(0, 1)), so after the same
-- attn.manual_seed the weights are torch's bits.
-- `forward(ids)`: 1-based ids [...] (a tensor of integer values or a table) -> [..., embedding_dim].
-- @classmod attn.nn.Embedding
local attn = require "attn"
local Module = require "attn.nn.Module"
local checks = require "attn.nn.checks"
local F = require "attn.nn.functional"

local Embedding = Module:extend("Embedding")

function Embedding:init(num_embeddings, embedding_dim, extra)
  num_embeddings = checks.positive_integer("Embedding", num_embeddings, 1, "num_embeddings")
  embedding_dim = checks.positive_integer("Embedding", embedding_dim, 2, "embedding_dim")
  checks.none("Embedding", extra, 3, "(num_embeddings, embedding_dim)")
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  self:add_parameter("weight", attn.empty(num_embeddings, embedding_dim):normal_(0, 1))
end

function Embedding:forward(ids)
  local ok, out = pcall(F.embedding, ids, self.weight)
  if not ok then checks.forward_error("Embedding", "attn.nn.functional.embedding", out) end
  return out
end

function Embedding:extra_repr()
  return ("%d, %d"):format(self.num_embeddings, self.embedding_dim)
end

return Embedding
