-- attn.nn.Module, ModuleList, Linear, Dropout against PyTorch 1.13: weights
-- bit for bit (spec/fixtures/torch_rng_vectors.lua), forward, naming, order
-- and repr (spec/fixtures/torch_rng_extra.lua, scripts/fixtures/gen_rng_torch.py).
local attn = require "attn"
local nn = attn.nn
local Module = require "attn.nn.Module"

local V = dofile("spec/fixtures/torch_rng_vectors.lua")
local X = dofile("spec/fixtures/torch_rng_extra.lua")
local SEEDS = {0, 42, 123, 789, 2024}

local bits = require "support.bits"
local f32bits, flat, assert_bits, error_matching = bits.f32bits, bits.flat, bits.assert_bits, bits.error_matching

-- the nested module of gen_rng_torch.py, in Lua
local Inner = Module:extend("Inner")
function Inner:init()
  self:add_module("lin", nn.Linear(2, 3))
  self:add_parameter("scale", attn.ones(3))
end

local Outer = Module:extend("Outer")
function Outer:init()
  self:add_parameter("a", attn.zeros(2))
  self:add_module("inner", Inner())
  self:add_module_list("heads", {nn.Linear(3, 2, {bias = false}), nn.Linear(3, 2, {bias = false})})
  self:add_buffer("mask", attn.ones(2, 2))
  self:add_parameter("b", attn.zeros(1))
  self:add_module("drop", nn.Dropout(0.25))
end
function Outer:forward(x) return self.heads[2](self.inner.lin(x)) end

describe("attn.nn.Linear", function()
  for _, seed in ipairs(SEEDS) do
    it("draws torch's weights bit for bit, seed " .. seed, function()
      attn.manual_seed(seed)
      local l1 = nn.Linear(3, 2, {bias = false})
      assert.are.same({2, 3}, l1.weight:size())
      assert.is_nil(l1.bias)
      assert_bits(l1.weight, V.seeds[seed].linear_3_2_nobias.weight, "Linear(3, 2) weight")
      attn.manual_seed(seed)
      local l2 = nn.Linear(4, 3)
      assert_bits(l2.weight, V.seeds[seed].linear_4_3_bias.weight, "Linear(4, 3) weight")
      assert_bits(l2.bias, V.seeds[seed].linear_4_3_bias.bias, "Linear(4, 3) bias")
    end)
  end

  for _, c in ipairs(X.linear) do
    it(("forward matches torch: seed %d, Linear(%d, %d, bias=%s), x %s"):format(
         c.seed, c.in_features, c.out_features, tostring(c.bias), table.concat(c.x_shape, "x")), function()
      attn.manual_seed(c.seed)
      local l = nn.Linear(c.in_features, c.out_features, {bias = c.bias})
      assert_bits(l.weight, c.weight, "weight")
      if c.bias then assert_bits(l.bias, c.bias_value, "bias") else assert.is_nil(l.bias) end
      local x = attn.rand(c.x_shape) -- continues the stream after the init draws
      assert_bits(x, c.x, "x")
      local y = l(x)
      assert.are.same(c.y_shape, y:size())
      local got = flat(y)
      for i, want in ipairs(c.y_dec) do
        assert.is_true(math.abs(got[i] - want) <= 1e-6 + 1e-5 * math.abs(want),
                       ("y[%d] = %.9g, torch %.9g"):format(i, got[i], want))
      end
      local y2 = l:forward(x)
      assert.are.same(got, flat(y2))
    end)
  end

  it("prints like torch", function()
    assert.are.equal(X.reprs.linear_3_2_nobias, tostring(nn.Linear(3, 2, {bias = false})))
    assert.are.equal(X.reprs.linear_4_3, tostring(nn.Linear(4, 3)))
  end)

  it("rejects bad widths, options and inputs", function()
    error_matching(function() nn.Linear(0, 2) end, "attn.nn.Linear: bad argument #1 'in_features' (expected a positive integer, got 0)")
    error_matching(function() nn.Linear(3, -1) end, "attn.nn.Linear: bad argument #2 'out_features' (expected a positive integer, got -1)")
    error_matching(function() nn.Linear(2.5, 2) end, "attn.nn.Linear: bad argument #1 'in_features' (expected a positive integer, got 2.5)")
    error_matching(function() nn.Linear("3", 2) end, "attn.nn.Linear: bad argument #1 'in_features' (expected a positive integer, got string)")
    error_matching(function() nn.Linear(3) end, "attn.nn.Linear: bad argument #2 'out_features' (expected a positive integer, got nil)")
    error_matching(function() nn.Linear(3, 2, false) end, "attn.nn.Linear: bad argument #3 'opts' (expected a table such as {bias = false}, got boolean)")
    error_matching(function() nn.Linear(3, 2, {bias = 1}) end, "attn.nn.Linear: bad option 'bias' (expected boolean, got number)")
    local l = nn.Linear(3, 2)
    error_matching(function() l(attn.ones(4, 5)) end, "Linear:forward: input of shape [4, 5] does not end in in_features = 3")
    error_matching(function() l(attn.tensor(1)) end, "Linear:forward: input of shape [] does not end in in_features = 3")
    error_matching(function() l({1, 2, 3}) end, "Linear:forward: bad argument #1 'input' (expected attn.Tensor, got table)")
  end)
end)

describe("attn.nn.Dropout", function()
  it("drops like attn.dropout in training and reproduces notebook 002", function()
    local d = nn.Dropout(0.5)
    assert.is_true(d.training)
    attn.manual_seed(123)
    assert.are.same(V.printed_reference_dropout.rows, d(attn.ones(6, 6)):totable())
  end)

  it("returns its input without draws in eval mode, and drops again after train()", function()
    local d = nn.Dropout(0.5)
    local x = attn.ones(36)
    attn.manual_seed(123)
    assert.are.equal(d, d:eval())
    assert.is_false(d.training)
    assert.are.equal(x, d(x))
    assert.are.equal(d, d:train())
    local flags = {}
    for i, v in ipairs(flat(d(x))) do flags[i] = v ~= 0 and 1 or 0 end
    assert.are.same(V.seeds[123].dropout_mkl["p0.5_n36"], flags)
  end)

  it("defaults to p = 0.5 and prints like torch", function()
    assert.are.equal(0.5, nn.Dropout().p)
    assert.are.equal(X.reprs.dropout_05, tostring(nn.Dropout(0.5)))
    assert.are.equal("Dropout(p=0.1, inplace=False)", tostring(nn.Dropout(0.1)))
    assert.are.equal("Dropout(p=0.0, inplace=False)", tostring(nn.Dropout(0)))
  end)

  it("rejects bad probabilities", function()
    error_matching(function() nn.Dropout(1.5) end, "attn.nn.Dropout: dropout probability has to be between 0 and 1, but got 1.5")
    error_matching(function() nn.Dropout(0 / 0) end, "attn.nn.Dropout: dropout probability has to be between 0 and 1")
    error_matching(function() nn.Dropout("0.5") end, "attn.nn.Dropout: dropout probability has to be between 0 and 1, but got string")
  end)
end)

describe("attn.nn.Module", function()
  it("direct_call: m(x) takes the direct function's result, else (nil, options, another forward) the forward", function()
    local Twice = Module:extend("Twice")
    function Twice:forward(x, opts) return x * (opts and opts.k or 3) end -- the protected way: x * 3
    local direct = function(_, x) if type(x) == "userdata" and x:numel() < 4 then return x * 2 end end
    Twice.__call = Module.direct_call(Twice, direct)
    local m = Twice()
    assert.are.same({2, 4}, m(attn.tensor({1, 2})):totable())          -- direct
    assert.are.same({3, 6, 9, 12}, m(attn.tensor({1, 2, 3, 4})):totable()) -- direct said nil
    assert.are.same({5, 10}, m(attn.tensor({1, 2}), {k = 5}):totable())  -- options: the forward
    m.forward = function(_, x) return x + 1 end                          -- replaced on the instance
    assert.are.same({2, 3}, m(attn.tensor({1, 2})):totable())
    error_matching(function() Twice()({1}) end, "Twice:forward: ")       -- errors worded by Module.__call
  end)

  it("direct_call: refuses what is not a class and a function, naming the argument", function()
    error_matching(function() Module.direct_call(nil, function() end) end,
      "Module.direct_call: bad argument #1 'cls' (expected a module class with a forward method, got nil)")
    error_matching(function() Module.direct_call(Module:extend("NoFn"), 42) end,
      "Module.direct_call: bad argument #2 'direct' (expected a function, got number)")
  end)

  it("names and orders parameters as torch (own first, then children; lists 0-based)", function()
    local m = Outer()
    local names, shapes = {}, {}
    for i, np in ipairs(m:named_parameters()) do
      names[i] = np[1]
      shapes[i] = np[2]:size()
    end
    assert.are.same(X.outer.named_parameters, names)
    assert.are.same(X.outer.shapes, shapes)
    assert.are.same(X.outer.state_dict_keys, m:state_dict_keys())
    assert.are.equal(X.outer.num_parameters, m:num_parameters())
    local params = m:parameters()
    assert.are.equal(#names, #params)
    assert.are.equal(m.inner.lin.weight, params[4])
    assert.are.equal(m.heads[2].weight, params[7])
    assert.are.equal(2, #m.heads)
  end)

  it("prints as torch's repr, children indented", function()
    assert.are.equal(X.outer.repr, tostring(Outer()))
    assert.are.equal("Inner(\n  (lin): Linear(in_features=2, out_features=3, bias=True)\n)", tostring(Inner()))
    assert.are.equal("Module()", tostring(Module()))
  end)

  it("calls forward on m(...) and switches training mode recursively", function()
    local m = Outer()
    local x = attn.rand(4, 2)
    assert.are.same(flat(m:forward(x)), flat(m(x)))
    assert.is_true(m.training and m.heads.training and m.heads[1].training and m.drop.training)
    assert.are.equal(m, m:eval())
    assert.is_false(m.training or m.inner.training or m.inner.lin.training or m.heads[2].training or m.drop.training)
    assert.are.equal(m, m:train(true))
    assert.is_true(m.inner.lin.training and m.drop.training)
    m:train(false)
    assert.is_false(m.drop.training)
  end)

  it("state_dict holds the module's tensors and round-trips through load_state_dict", function()
    attn.manual_seed(1)
    local src = Outer()
    attn.no_grad(function() src.a:fill_(3) end) -- a parameter: edited inside no_grad, as in torch
    src.mask:fill_(7)
    attn.manual_seed(2)
    local dst = Outer()
    local d = src:state_dict()
    assert.are.equal(src.inner.lin.bias, d["inner.lin.bias"])
    local r = dst:load_state_dict(d)
    assert.are.same({missing_keys = {}, unexpected_keys = {}}, r)
    for _, k in ipairs(dst:state_dict_keys()) do
      assert.are.same(flat(src:state_dict()[k]), flat(dst:state_dict()[k]), k)
      assert.are_not.equal(src:state_dict()[k], dst:state_dict()[k]) -- copied, not shared
    end
    assert.are.equal(3, dst.a[1])
    assert.are.equal(7, dst.mask[2][2])
  end)

  it("load_state_dict names missing, unexpected and mis-shaped keys and copies nothing then", function()
    local m = Outer()
    local before = flat(m.inner.lin.weight)
    local d = Outer():state_dict()
    d["a"] = nil
    d["zzz"] = attn.ones(1)
    error_matching(function() m:load_state_dict(d) end,
                   'Outer:load_state_dict: error(s) in loading the state dict for Outer: missing key(s): "a"; unexpected key(s): "zzz"')
    local d2 = Outer():state_dict()
    d2["inner.lin.weight"] = attn.ones(2, 3)
    error_matching(function() m:load_state_dict(d2) end,
                   'size mismatch for "inner.lin.weight": copying a tensor of shape [2, 3] from the state dict, the shape in the module is [3, 2]')
    local d3 = Outer():state_dict()
    d3["b"] = {0}
    error_matching(function() m:load_state_dict(d3) end, 'value for "b" is not an attn.Tensor (got table)')
    assert.are.same(before, flat(m.inner.lin.weight))
    error_matching(function() m:load_state_dict("x") end,
                   "Outer:load_state_dict: bad argument #1 'state_dict' (expected a table name -> attn.Tensor, got string)")
    error_matching(function() m:load_state_dict({}, 1) end, "Outer:load_state_dict: bad argument #2 'strict' (expected boolean, got number)")
  end)

  it("load_state_dict(d, false) skips missing/unexpected keys and reports them", function()
    local m = Outer()
    local d = {a = attn.full({2}, 5), extra = attn.ones(1)}
    local r = m:load_state_dict(d, false)
    assert.are.same({"extra"}, r.unexpected_keys)
    assert.are.equal(#X.outer.state_dict_keys - 1, #r.missing_keys)
    assert.are.same({5, 5}, m.a:totable())
  end)

  it("lists a shared tensor once in parameters, as torch", function()
    local Tied = Module:extend("Tied")
    function Tied:init()
      self:add_module("enc", nn.Linear(2, 2, {bias = false}))
      self:add_module("dec", nn.Linear(2, 2, {bias = false}))
      self.dec.weight = self.enc.weight
    end
    local t = Tied()
    assert.are.equal(1, #t:named_parameters())
    assert.are.equal("enc.weight", t:named_parameters()[1][1])
    assert.are.equal(4, t:num_parameters())
    assert.are.same({"enc.weight", "dec.weight"}, t:state_dict_keys())
  end)

  it("non-persistent buffers stay out of the state dict; nil fields drop out", function()
    local B = Module:extend("B")
    function B:init()
      self:add_buffer("tmp", attn.ones(1), false)
      self:add_parameter("w", attn.ones(2))
      self:add_parameter("v", attn.ones(3))
    end
    local b = B()
    b.v = nil
    assert.are.same({"w"}, b:state_dict_keys())
  end)

  it("finds classes of lua/attn/nn/NAME.lua as attn.nn.NAME", function()
    assert.are.equal(require "attn.nn.Linear", nn.Linear)
    assert.is_nil(nn.NoSuchClass)
    assert.are.equal("class attn.nn.Linear", tostring(nn.Linear))
  end)

  it("rejects bad registrations and calls", function()
    error_matching(function() Module:extend("bad name") end, 'Module:extend: bad argument #1 \'name\' (expected a class name such as "CausalAttention", got "bad name")')
    error_matching(function() Module:extend() end, "Module:extend: bad argument #1 'name'")
    local m = Module()
    error_matching(function() m:add_parameter("w", {}) end, "Module:add_parameter: bad argument #2 'tensor' (expected attn.Tensor, got table)")
    error_matching(function() m:add_parameter("a.b", attn.ones(1)) end, "Module:add_parameter: bad argument #1 'name' (expected a non-empty string without '.', got \"a.b\")")
    m:add_parameter("w", attn.ones(1))
    error_matching(function() m:add_module("w", nn.Dropout()) end, 'Module:add_module: "w" is already registered as a parameter')
    error_matching(function() m:add_module("c", attn.ones(1)) end, "Module:add_module: bad argument #2 'module' (expected an attn.nn module, got userdata)")
    error_matching(function() m:add_buffer("buf", 3) end, "Module:add_buffer: bad argument #2 'tensor' (expected attn.Tensor, got number)")
    error_matching(function() m:add_module_list("l", {nn.Dropout(), 5}) end, "attn.nn.ModuleList: element 2 is not an attn.nn module (got number)")
    error_matching(function() m:add_module_list("l", nn.Dropout()) end, "Module:add_module_list: bad argument #2 'modules' (expected a list of attn.nn modules, got Dropout)")
    error_matching(function() m(attn.ones(1)) end, "Module:forward: not implemented")
    error_matching(function() m:train("yes") end, "Module:train: bad argument #1 'mode' (expected boolean, got string)")
    error_matching(function() nn.ModuleList({})(attn.ones(1)) end, "ModuleList:forward: a ModuleList has no forward")
  end)
end)
