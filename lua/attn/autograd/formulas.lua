--- Where each backward formula lives (PyTorch's derivatives.yaml index), and
-- the one call that puts the recorded ops in place: init.lua runs
-- `require("attn.autograd.formulas").install(attn)` once. Every file named
-- here is under lua/attn/autograd/; the engine itself (Function, backward,
-- grad, no_grad) is attn.autograd (init.lua there).
--
--   derivatives.lua         the built-in ops of the core, over their raw C functions:
--                           elementwise (add, sub, mul, div, pow, remainder, maximum,
--                           minimum, their in-place forms, neg, exp, log, sqrt, tanh,
--                           abs, floor, sigmoid, relu, reciprocal), reductions (sum,
--                           mean, max, min), softmax, log_softmax, masked_fill(_),
--                           triu/tril(_), dropout, matmul, dot, views (view, reshape,
--                           squeeze, unsqueeze, expand, transpose, t, permute, narrow,
--                           select), clone, contiguous, cat, stack, simple_attention,
--                           fills (fill_, zero_, uniform_, normal_, copy_), and the
--                           operators + - * / ^ % and unary minus
--   indexing_stats_ops.lua  the ops of src/binding/lua_ops.c and erf, sin, cos: clamp(_),
--                           var, std, where, cumsum, index_select, gather,
--                           scatter_add(_), chunk, split, repeat_interleave, topk, sort
--   sdpa.lua                scaled_dot_product_attention and the fused module
--                           attention (the C backward of src/core/sdpa_backward.c and
--                           src/core/modules_backward.c)
--   rope.lua                rope (the C backward, a rotation by -theta)
--   linear.lua              F.linear (nn.Linear, nn.MultiheadAttention's projections)
--   train_ops.lua           layer_norm, gelu, cross_entropy, embedding (the C kernels
--                           of attn.core.train; nn.functional calls them)
--
-- linear.lua and train_ops.lua replace no function of `attn`: the nn layer
-- requires them where it needs them, so install leaves them alone.
-- @module attn.autograd.formulas
local M = {}

--- Put the recorded ops in place of the raw C ones in `attn` (the module
-- table being built), its Tensor methods and the tensor metatable.
-- @param attn the module table
function M.install(attn)
  require("attn.autograd.derivatives").install(attn)
  require("attn.autograd.indexing_stats_ops").install(attn)
  require("attn.autograd.sdpa").install(attn)
  attn.rope = require("attn.autograd.rope").rope
end

return M
