-- make demo: the notebooks' simplified self-attention on the six tokens of
-- "Your journey starts with one step", computed with attn.
local attn = require "attn"

local tokens = { "Your", "journey", "starts", "with", "one", "step" }
local inputs = attn.tensor {
  { 0.43, 0.15, 0.89 }, -- Your     (x^1)
  { 0.55, 0.87, 0.66 }, -- journey  (x^2)
  { 0.57, 0.85, 0.64 }, -- starts   (x^3)
  { 0.22, 0.58, 0.33 }, -- with     (x^4)
  { 0.77, 0.25, 0.10 }, -- one      (x^5)
  { 0.05, 0.80, 0.55 }, -- step     (x^6)
}

local scores = inputs:matmul(inputs:t())   -- [6, 6] dot products
local weights = scores:softmax(-1)          -- each row sums to 1
local context = weights:matmul(inputs)      -- [6, 3] context vectors

print("Simplified self-attention on: " .. table.concat(tokens, " "))
print("attention weights:")
print(weights)
print("context vectors:")
print(context)
