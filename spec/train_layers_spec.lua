-- The training layers of attn.nn (Embedding, LayerNorm, GELU, Sequential,
-- CrossEntropyLoss), attn.nn.functional and attn.nn.utils against PyTorch 1.13
-- (fixtures: spec/fixtures/train_cases.lua, scripts/fixtures/make_train_fixtures.py):
-- torch's initial bits after the same seed, names, repr, outputs; options and
-- bad input raise errors naming the class or function; every public name has a doc.
local attn = require "attn"
local nn = attn.nn
local F = nn.functional
local C = dofile("spec/fixtures/tensor_check.lua")
local FX = dofile("spec/fixtures/train_cases.lua")

local M = FX.model

-- the fixture's model: Sequential(Embedding(11, 6), LayerNorm(6), Linear(6, 12), GELU(tanh), Linear(12, 11))
local function build_model()
  attn.manual_seed(M.seed)
  return nn.Sequential(nn.Embedding(11, 6), nn.LayerNorm(6), nn.Linear(6, 12), nn.GELU { approximate = "tanh" },
    nn.Linear(12, 11))
end

local function near(got, want, rtol, what)
  local m = 0
  for _, v in ipairs(want.data) do if v == v then m = math.max(m, math.abs(v)) end end
  return C.close(got, want, rtol, rtol * m, what)
end

describe("the training layers against torch", function()
  it("a Sequential of Embedding, LayerNorm, Linear, GELU, Linear: torch's names, repr and initial bits", function()
    local m = build_model()
    local names = {}
    for i, np in ipairs(m:named_parameters()) do names[i] = np[1] end
    assert.are.same(M.names, names)
    assert.are.equal(M.repr, tostring(m))
    for i, p in ipairs(m:parameters()) do C.exact(p, M.init[i], M.names[i]) end
    assert.are.equal(5, #m)
    assert.are.equal("Embedding", getmetatable(m[1]).__name)
    assert.are.same({"0.weight", "1.weight", "1.bias", "2.weight", "2.bias", "4.weight", "4.bias"}, m:state_dict_keys())
  end)

  it("its forward and cross entropy are torch's (logits within 1e-5, loss within 1e-6)", function()
    local m = build_model()
    local logits = m(C.T(M.ids))
    near(logits, M.logits, 1e-5, "logits")
    local loss = F.cross_entropy(logits:reshape(-1, 11), C.T(M.target):reshape(-1))
    assert(math.abs(loss:item() - M.loss) <= 1e-6 * M.loss, ("loss %.9g, torch %.9g"):format(loss:item(), M.loss))
    -- logits [..., C] with target [...] directly, and nn.CrossEntropyLoss, give the same loss
    assert.are.equal(loss:item(), F.cross_entropy(logits, C.T(M.target)):item())
    assert.are.equal(loss:item(), nn.CrossEntropyLoss()(logits, C.T(M.target)):item())
  end)

  it("ids and targets may be Lua tables of 1-based ids", function()
    local m = build_model()
    local ids = {}
    for i, v in ipairs(M.ids.data) do ids[i] = v end
    local a = m(C.T(M.ids)):reshape(-1, 11)
    local b = m[1](ids)
    C.same_bits(b, m[1](C.T(M.ids):reshape(-1)))
    local target = {}
    for i, v in ipairs(M.target.data) do target[i] = v end
    assert.are.equal(F.cross_entropy(a, C.T(M.target):reshape(-1)):item(), F.cross_entropy(a, target):item())
  end)
end)

describe("nn.functional against the kernels' torch fixtures", function()
  it("cross_entropy with every option (reduction, label_smoothing, ignore_index) gives torch's losses", function()
    for i, c in ipairs(FX.cross_entropy) do
      local loss = F.cross_entropy(C.T(c.logits), C.T(c.target),
        {reduction = c.reduction, label_smoothing = c.label_smoothing, ignore_index = c.ignore_index})
      near(loss, c.loss, 2e-6, "case " .. i)
      local m = nn.CrossEntropyLoss {reduction = c.reduction, label_smoothing = c.label_smoothing,
        ignore_index = c.ignore_index}
      C.same_bits(m(C.T(c.logits), C.T(c.target)), loss, "module, case " .. i)
    end
  end)

  it("gelu and nn.GELU, both approximations", function()
    for _, c in ipairs(FX.gelu) do
      near(F.gelu(C.T(c.x), {approximate = c.approximate}), c.y, 2e-6, c.approximate)
      near(nn.GELU {approximate = c.approximate}(C.T(c.x)), c.y, 2e-6, c.approximate)
    end
    C.same_bits(F.gelu(C.T(FX.gelu[1].x)), nn.GELU()(C.T(FX.gelu[1].x)))
  end)

  it("layer_norm and nn.LayerNorm (weights loaded), with and without affine", function()
    for i, c in ipairs(FX.layer_norm) do
      local d = c.x.shape[#c.x.shape]
      local w, b = c.weight and C.T(c.weight), c.bias and C.T(c.bias)
      near(F.layer_norm(C.T(c.x), d, w, b, c.eps), c.y, 2e-6, "functional " .. i)
      local m = nn.LayerNorm(d, {eps = c.eps, elementwise_affine = w ~= nil})
      if w then m:load_state_dict({weight = w, bias = b}) end
      near(m(C.T(c.x)), c.y, 2e-6, "module " .. i)
    end
  end)

  it("layer_norm over several trailing dims equals a hand computation in doubles", function()
    local x = C.lcg_tensor(7, 2, 2, 3, 4)
    local w, b = C.lcg_tensor(8, 1, 3, 4), C.lcg_tensor(9, 1, 3, 4)
    local y = F.layer_norm(x, {3, 4}, w, b)
    local xs, ws, bs, ys = C.flat(x), C.flat(w), C.flat(b), C.flat(y)
    for row = 0, 1 do
      local mean, var = 0, 0
      for j = 1, 12 do mean = mean + xs[row * 12 + j] / 12 end
      for j = 1, 12 do var = var + (xs[row * 12 + j] - mean) ^ 2 / 12 end
      for j = 1, 12 do
        local want = (xs[row * 12 + j] - mean) / math.sqrt(var + 1e-5) * ws[j] + bs[j]
        assert(math.abs(ys[row * 12 + j] - want) <= 2e-6 * (1 + math.abs(want)), ("row %d col %d"):format(row, j))
      end
    end
    assert.are.same({2, 3, 4}, y:size())
    local m = nn.LayerNorm({3, 4})
    assert.are.same({3, 4}, m.weight:size())
    assert.are.equal("LayerNorm((3, 4), eps=1e-05, elementwise_affine=True)", tostring(m))
  end)

  it("embedding and nn.Embedding gather torch's rows", function()
    local c = FX.embedding[1]
    C.exact(F.embedding(C.T(c.ids), C.T(c.weight)), c.out)
    local m = nn.Embedding(10, 4)
    m:load_state_dict({weight = C.T(c.weight)})
    C.exact(m(C.T(c.ids)), c.out)
    assert.are.equal("Embedding(10, 4)", tostring(m))
  end)

  it("linear, dropout, softmax and scaled_dot_product_attention are the attn functions", function()
    local x, w, b = C.lcg_tensor(1, 1, 2, 3), C.lcg_tensor(2, 1, 4, 3), C.lcg_tensor(3, 1, 4)
    C.same_bits(F.linear(x, w, b), attn.matmul(x, w:t()) + b)
    C.same_bits(F.linear(x, w), attn.matmul(x, w:t()))
    C.same_bits(F.softmax(x, -1), attn.softmax(x, -1))
    C.same_bits(F.dropout(x, 0.5, false), x)
    attn.manual_seed(3)
    local d1 = F.dropout(x, 0.5)
    attn.manual_seed(3)
    C.same_bits(d1, attn.dropout(x, 0.5, true))
    assert.are.equal(attn.scaled_dot_product_attention, F.scaled_dot_product_attention)
  end)
end)

describe("the training layers' bad input", function()
  it("raise errors naming the class or function, the argument, what was expected and what came", function()
    C.fails(function() nn.Embedding(0, 3) end, "attn.nn.Embedding: bad argument #1 'num_embeddings' (expected a positive integer, got 0)")
    C.fails(function() nn.Embedding(3, 2.5) end, "attn.nn.Embedding: bad argument #2 'embedding_dim'")
    C.fails(function() nn.Embedding(3, 2)({1, 4}) end, "Embedding:forward: ids[2] = 4 is out of range (ids are 1 to 3)")
    C.fails(function() nn.Embedding(3, 2)(attn.tensor{1.5}) end, "Embedding:forward: ids[1] = 1.5 is not an integer token id")
    C.fails(function() nn.Embedding(3, 2)("x") end, "Embedding:forward: bad argument #1 'input'")
    C.fails(function() nn.LayerNorm(0) end, "attn.nn.LayerNorm: bad argument #1 'normalized_shape'")
    C.fails(function() nn.LayerNorm(4, {eps = -1}) end, "attn.nn.LayerNorm: bad option 'eps' (expected a number >= 0, got -1")
    C.fails(function() nn.LayerNorm(4, {bias = false}) end, "attn.nn.LayerNorm: unknown option 'bias'")
    C.fails(function() nn.LayerNorm(4)(attn.ones(2, 3)) end,
      "LayerNorm:forward: input of shape [2, 3] does not end in normalized_shape [4]")
    C.fails(function() nn.GELU {approximate = "fast"} end, "attn.nn.GELU: bad option 'approximate' (expected \"none\" or \"tanh\", got \"fast\")")
    C.fails(function() nn.Sequential(nn.GELU(), 3) end, "attn.nn.Sequential: bad argument #2 (expected an attn.nn module, got number)")
    C.fails(function() nn.Sequential({nn.GELU()}) end, "pass the modules as arguments")
    C.fails(function() nn.Sequential(nn.Linear(2, 3), nn.Linear(2, 3))(attn.ones(1, 2)) end,
      "Sequential:forward: child 1 (Linear): Linear:forward: input of shape [1, 3] does not end in in_features = 2")
    C.fails(function() nn.CrossEntropyLoss {reduction = "avg"} end, "attn.nn.CrossEntropyLoss: bad option 'reduction'")
    C.fails(function() nn.CrossEntropyLoss {label_smoothing = 2} end, "attn.nn.CrossEntropyLoss: bad option 'label_smoothing'")
    C.fails(function() nn.CrossEntropyLoss()(attn.zeros(2, 3), {1, 4}) end,
      "CrossEntropyLoss:forward: target[2] = 4 is out of range (class ids are 1 to 3)")
    C.fails(function() F.cross_entropy(attn.zeros(2, 3), {1}) end,
      "attn.nn.functional.cross_entropy: 'target' of shape [1] does not fit input [2, 3]")
    C.fails(function() F.cross_entropy(attn.zeros(2, 3), {1, 2}, {weight = 1}) end,
      "attn.nn.functional.cross_entropy: unknown option 'weight'")
    C.fails(function() F.cross_entropy(attn.zeros(2, 3), {1, "a"}) end, "attn.nn.functional.cross_entropy: bad argument #2 'target'")
    C.fails(function() F.cross_entropy({}, {1}) end, "attn.nn.functional.cross_entropy: bad argument #1 'input' (expected attn.Tensor, got table)")
    C.fails(function() F.layer_norm(attn.ones(2, 3), 3, attn.ones(4)) end,
      "attn.nn.functional.layer_norm: 'weight' of shape [4] does not match normalized_shape [3]")
    C.fails(function() F.linear(attn.ones(2, 3), attn.ones(4, 2)) end,
      "attn.nn.functional.linear: input of shape [2, 3] does not fit weight [4, 2]")
    C.fails(function() F.linear(attn.ones(2, 3), attn.ones(4, 3), attn.ones(3)) end,
      "attn.nn.functional.linear: 'bias' of shape [3] does not fit weight [4, 3] (expected [4])")
    C.fails(function() F.dropout(attn.ones(2), 2) end, "attn.nn.functional.dropout: bad argument #2 'p'")
    C.fails(function() F.embedding({1}, attn.ones(3)) end, "attn.nn.functional.embedding: 'weight' must be 2-D")
  end)
end)

describe("docs", function()
  it("every public name of nn.functional, nn.utils and attn.optim, and the new classes, has a doc", function()
    local help = require "attn.tools.help"
    local missing = {}
    local function check(prefix, t)
      for name in pairs(t) do
        if type(name) == "string" and not name:match("^_") then
          if not pcall(help.text, prefix .. name) then missing[#missing + 1] = prefix .. name end
        end
      end
    end
    check("nn.functional.", nn.functional)
    check("nn.utils.", nn.utils)
    check("optim.", attn.optim)
    for _, n in ipairs({"nn.Embedding", "nn.LayerNorm", "nn.GELU", "nn.Sequential", "nn.CrossEntropyLoss",
                        "nn.functional", "nn.utils", "optim"}) do
      if not pcall(help.text, n) then missing[#missing + 1] = n end
    end
    table.sort(missing)
    assert.are.equal("", table.concat(missing, ", "))
  end)
end)
