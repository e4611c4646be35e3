--- The differentiable training ops (attn.autograd.Function definitions over
-- the C kernels of attn.core.train): layer_norm, gelu, cross_entropy and
-- embedding, each with PyTorch 1.13's grad_fn name. nn.functional and the nn
-- classes call these; they take checked arguments (see lua/attn/nn/functional.lua)
-- and `fname`, the public name the kernels' errors are raised under.
-- @module attn.autograd.train_ops
local autograd = require "attn.autograd"
local T = require("attn.core").train

local ops = {}

--- layer_norm(x, weight, bias, eps, fname): x [..., D], weight and bias [D] -> [..., D].
ops.layer_norm = autograd.Function {
  name = "NativeLayerNormBackward0",
  forward = function(ctx, x, weight, bias, eps, fname)
    local y, mean, rstd = T.layer_norm(x, weight, bias, eps, fname)
    ctx:save_for_backward(x, weight, mean, rstd)
    ctx.fname = fname
    return y
  end,
  backward = function(ctx, grad)
    local x, weight, mean, rstd = ctx:saved()
    local need = ctx.needs_input_grad
    return T.layer_norm_backward(grad, x, mean, rstd, weight, need[1], need[2], need[3], ctx.fname)
  end,
}

--- layer_norm_plain(x, eps, fname): without weight and bias (elementwise_affine = false).
ops.layer_norm_plain = autograd.Function {
  name = "NativeLayerNormBackward0",
  forward = function(ctx, x, eps, fname)
    local y, mean, rstd = T.layer_norm(x, nil, nil, eps, fname)
    ctx:save_for_backward(x, mean, rstd)
    ctx.fname = fname
    return y
  end,
  backward = function(ctx, grad)
    local x, mean, rstd = ctx:saved()
    return (T.layer_norm_backward(grad, x, mean, rstd, nil, true, false, false, ctx.fname))
  end,
}

--- gelu(x, approximate, fname): elementwise, approximate "none" or "tanh".
ops.gelu = autograd.Function {
  name = "GeluBackward0",
  forward = function(ctx, x, approximate, fname)
    local y = T.gelu(x, approximate, fname)
    ctx:save_for_backward(x)
    ctx.approximate, ctx.fname = approximate, fname
    return y
  end,
  backward = function(ctx, grad)
    local x = ctx:saved()
    return T.gelu_backward(grad, x, ctx.approximate, ctx.fname)
  end,
}

--- cross_entropy(logits, target, ignore_index, reduction, label_smoothing, fname): logits [..., C],
-- target [...] (1-based class ids) -> the loss. torch's grad_fn is NllLossBackward0, or
-- AddBackward0 with label smoothing (torch adds the smoothing term to the nll loss).
ops.cross_entropy = autograd.Function {
  name = function(_, _, _, _, label_smoothing) return label_smoothing ~= 0 and "AddBackward0" or "NllLossBackward0" end,
  forward = function(ctx, logits, target, ignore_index, reduction, label_smoothing, fname)
    local loss, lse = T.cross_entropy(logits, target, ignore_index, reduction, label_smoothing, fname)
    ctx:save_for_backward(logits, target, lse)
    ctx.ignore_index, ctx.reduction, ctx.label_smoothing, ctx.fname = ignore_index, reduction, label_smoothing, fname
    return loss
  end,
  backward = function(ctx, grad)
    local logits, target, lse = ctx:saved()
    return T.cross_entropy_backward(grad, logits, target, lse, ctx.ignore_index, ctx.reduction, ctx.label_smoothing,
      ctx.fname), nil
  end,
}

--- embedding(ids, weight, fname): ids [...] (1-based), weight [V, D] -> [..., D].
ops.embedding = autograd.Function {
  name = "EmbeddingBackward0",
  forward = function(ctx, ids, weight, fname)
    local out = T.embedding(weight, ids, fname)
    ctx:save_for_backward(ids)
    ctx.num_embeddings, ctx.fname = weight:size(1), fname
    return out
  end,
  backward = function(ctx, grad)
    local ids = ctx:saved()
    return nil, T.embedding_backward(grad, ids, ctx.num_embeddings, ctx.fname)
  end,
}

return ops
