-- requires_grad on computed (non-leaf) tensors, and optimizers given one, as
-- PyTorch 1.13: requires_grad_() / requires_grad_(true) is a no-op returning
-- the tensor, requires_grad_(false) and the requires_grad field refuse, and
-- torch.optim refuses a non-leaf ("can't optimize a non-leaf Tensor").
local attn = require "attn"

local function fails_with(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  for _, s in ipairs({ ... }) do assert.truthy(tostring(err):find(s, 1, true), tostring(err)) end
end

describe("requires_grad on a computed tensor", function()
  it("as PyTorch 1.13: requires_grad_() and requires_grad_(true) return it unchanged", function()
    local x = attn.ones(2):requires_grad_()
    local y = x * 2
    local node = y.grad_fn
    assert.are.equal(y, y:requires_grad_())
    assert.are.equal(y, y:requires_grad_(true))
    assert.are.equal(node, y.grad_fn)
    assert.is_false(y.is_leaf)
    y:sum():backward()
    assert.are.same({ 2, 2 }, x.grad:totable())
  end)

  it("as PyTorch 1.13: requires_grad_(false) refuses, naming detach", function()
    local y = attn.ones(2):requires_grad_() * 2
    fails_with(function() y:requires_grad_(false) end, "Tensor:requires_grad_: you can only change requires_grad flags of leaf tensors",
      "t:detach()")
  end)

  it("as PyTorch 1.13's setter: the requires_grad field refuses either value", function()
    local y = attn.ones(2):requires_grad_() * 2
    fails_with(function() y.requires_grad = true end, "attn.Tensor field 'requires_grad': you can only change requires_grad flags of leaf tensors")
    fails_with(function() y.requires_grad = false end, "attn.Tensor field 'requires_grad'", "t:detach()")
    assert.is_true(y.requires_grad)
  end)
end)

describe("optimizers given a computed tensor", function()
  for _, name in ipairs({ "SGD", "Adam", "AdamW" }) do
    it("as PyTorch 1.13 attn.optim." .. name .. " refuses a non-leaf parameter by position", function()
      local leaf = attn.ones(2):requires_grad_()
      local computed = leaf * 3
      fails_with(function() attn.optim[name]({ leaf, computed }, { lr = 0.1 }) end,
        "attn.optim." .. name .. ": bad argument #1 'params' (element 2 is not a leaf tensor")
      fails_with(function() attn.optim[name]({ { params = { computed } } }, { lr = 0.1 }) end,
        "element 1 of param group 1 is not a leaf tensor")
    end)
  end
  it("tensors that do not require grad are leaves, and accepted (as PyTorch 1.13)", function()
    local plain = attn.ones(2)
    assert.is_true(plain.is_leaf)
    local opt = attn.optim.SGD({ plain }, { lr = 0.1 })
    opt:step()
    assert.are.same({ 1, 1 }, plain:totable())
  end)
end)
