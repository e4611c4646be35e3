--- attn.optim: the optimizers SGD, Adam and AdamW (PyTorch's torch.optim,
-- float32 single-tensor arithmetic, bit for bit).
-- @module attn.optim
return {
  Optimizer = require "attn.optim.Optimizer",
  SGD = require "attn.optim.SGD",
  Adam = require "attn.optim.Adam",
  AdamW = require "attn.optim.AdamW",
}
