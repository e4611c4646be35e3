-- The attention modules of attn.nn against PyTorch 1.13 (fixtures:
-- spec/fixtures/nn_attention_cases.lua, written by scripts/fixtures/make_nn_fixtures.py
-- from the notebooks' own classes): after attn.manual_seed(s) the parameters
-- are torch's bits, inputs drawn after construction are torch's bits, outputs
-- agree within 2e-5 (training-mode dropout included: the fixture applies the
-- MKL-style mask), the forward call consumes the same random numbers,
-- named_parameters / state_dict keys / num_parameters / repr are torch's, and a
-- torch state dict loaded into a module gives torch's outputs.
local attn = require "attn"
local nn = attn.nn
local C = dofile("spec/fixtures/tensor_check.lua")
local F = dofile("spec/fixtures/nn_attention_cases.lua")

local TOL = 2e-5

-- A fresh module for a fixture case (the same constructor call as the torch side).
local function build(class, c)
  local a = c.args
  if class == "SelfAttentionV1" then return nn.SelfAttentionV1(a[1], a[2]) end
  if class == "SelfAttentionV2" then return nn.SelfAttentionV2(a[1], a[2], {qkv_bias = c.qkv_bias}) end
  if class == "CausalAttention" then
    return nn.CausalAttention(a[1], a[2], a[3], a[4], {qkv_bias = c.qkv_bias})
  end
  if class == "MultiHeadAttentionWrapper" then
    return nn.MultiHeadAttentionWrapper(a[1], a[2], a[3], a[4], a[5], {qkv_bias = c.qkv_bias})
  end
  if class == "MultiHeadAttention" then
    return nn.MultiHeadAttention(a[1], a[2], a[3], a[4], a[5], {qkv_bias = c.qkv_bias, scale = c.scale})
  end
  if class == "Attention" then return nn.Attention(a[1], {row_dim = c.row_dim, col_dim = c.col_dim}) end
  error("unknown class " .. class)
end

local function call(class, m, c, xs)
  if class == "Attention" then
    return m(xs[1], xs[2], xs[2], c.mask and C.T(c.mask) or nil)
  end
  return m(xs[1])
end

local function describe_case(class, c)
  local parts = {"seed " .. c.seed, "args (" .. table.concat(c.args, ", ") .. ")"}
  if c.qkv_bias then parts[#parts + 1] = "qkv_bias" end
  if c.scale then parts[#parts + 1] = ("scale %.4g"):format(c.scale) end
  if c.mask then parts[#parts + 1] = "mask " .. table.concat(c.mask.shape, "x") end
  parts[#parts + 1] = "x " .. table.concat(c.x[1].shape, "x")
  if class == "Attention" then parts[#parts + 1] = "kv " .. table.concat(c.x[2].shape, "x") end
  if not c.train then parts[#parts + 1] = "eval" end
  return table.concat(parts, ", ")
end

local function state_of(c)
  local d = {}
  for _, e in ipairs(c.state) do d[e[1]] = e[2] end
  return d
end

local function names_of(list)
  local out = {}
  for i, e in ipairs(list) do out[i] = e[1] end
  return out
end

local function has_dropout(c)
  return c.train and c.args[4] ~= nil and c.args[4] > 0
end

local CLASSES = {"SelfAttentionV1", "SelfAttentionV2", "CausalAttention", "MultiHeadAttentionWrapper",
                 "MultiHeadAttention", "Attention"}

for _, class in ipairs(CLASSES) do
  describe("attn.nn." .. class .. " against PyTorch", function()
    for _, c in ipairs(F.cases[class]) do
      local label = describe_case(class, c)

      it("parameters are torch's bits after manual_seed, inputs drawn after construction too: " .. label, function()
        attn.manual_seed(c.seed)
        local m = build(class, c)
        local state = state_of(c)
        local names = names_of(m:named_parameters())
        assert.are.same(c.param_names, names)
        for _, np in ipairs(m:named_parameters()) do
          C.exact(np[2], state[np[1]], class .. " parameter " .. np[1])
        end
        for i, x in ipairs(c.x) do C.exact(attn.rand(x.shape), x, "input " .. i) end
      end)

      it("forward agrees within 2e-5 and consumes torch's random numbers: " .. label, function()
        attn.manual_seed(c.seed)
        local m = build(class, c)
        assert.is_true(m.training)
        m:train(c.train)
        local xs = {}
        for i, x in ipairs(c.x) do xs[i] = attn.rand(x.shape) end
        local out = call(class, m, c, xs)
        C.close(out, c.out, 0, TOL, class .. " output")
        C.exact(attn.rand(4), c.after, "attn.rand(4) after forward")
      end)

      it("named_parameters, state_dict keys, num_parameters and repr are torch's: " .. label, function()
        attn.manual_seed(c.seed)
        local m = build(class, c)
        assert.are.same(names_of(c.state), m:state_dict_keys())
        local sd = m:state_dict()
        local n = 0
        for _ in pairs(sd) do n = n + 1 end
        assert.are.equal(#c.state, n)
        for _, e in ipairs(c.state) do C.exact(sd[e[1]], e[2], "state_dict " .. e[1]) end
        assert.are.equal(c.num_parameters, m:num_parameters())
        local params = m:parameters()
        assert.are.equal(#c.param_names, #params)
        local s = tostring(m)
        assert.are.equal(1, s:find(class .. "(", 1, true))
        if class == "SelfAttentionV1" then
          assert.are.equal(("SelfAttentionV1(d_in=%d, d_out=%d)"):format(c.args[1], c.args[2]), s)
        elseif class == "Attention" then
          -- torch's Attention has no extra_repr; attn's adds its sizes as a first line
          local want = c.repr:gsub("^Attention%(\n", ("Attention(\n  d_model=%d, row_dim=%d, col_dim=%d\n"):format(
            c.args[1], c.row_dim, c.col_dim))
          assert.are.equal(want, s)
        else
          local want = c.repr:gsub("SelfAttention_v2", "SelfAttentionV2"):gsub("MKLDropout", "Dropout")
          assert.are.equal(want, s)
        end
      end)

      if not has_dropout(c) then
        it("load_state_dict of torch's state dict gives torch's output: " .. label, function()
          attn.manual_seed(c.seed + 1000)
          local m = build(class, c)
          local d = {}
          for _, e in ipairs(c.state) do d[e[1]] = C.T(e[2]) end
          local res = m:load_state_dict(d)
          assert.are.same({missing_keys = {}, unexpected_keys = {}}, res)
          for _, np in ipairs(m:named_parameters()) do
            C.exact(np[2], state_of(c)[np[1]], "loaded " .. np[1])
          end
          m:train(c.train)
          local xs = {}
          for i, x in ipairs(c.x) do xs[i] = C.T(x) end
          C.close(call(class, m, c, xs), c.out, 0, TOL, class .. " output after load_state_dict")
        end)
      end
    end
  end)
end

describe("attn.nn modules: sizes of the book's exercises", function()
  it("exercise 3.3: a GPT-2 sized MultiHeadAttention (768, 768, 1024, 12 heads) has 2,360,064 parameters", function()
    local m = nn.MultiHeadAttention(768, 768, 1024, 0.0, 12)
    assert.are.equal(2360064, F.meta.gpt2_mha_num_parameters)      -- torch's count
    assert.are.equal(3 * 768 * 768 + 768 * 768 + 768, 2360064)     -- by hand
    assert.are.equal(2360064, m:num_parameters())
    assert.are.same(F.meta.gpt2_mha_param_names, names_of(m:named_parameters()))
    assert.are.same({768, 768}, m.out_proj.weight:size())
    assert.are.same({1024, 1024}, m.mask:size())
    assert.are.equal(64, m.head_dim)
  end)

  it("exercise 3.2: a wrapper with d_out = 1 and 2 heads has output width 2 (torch's numbers)", function()
    local c = F.cases.MultiHeadAttentionWrapper[1]
    assert.are.same({3, 1, 6, 0.0, 2}, c.args)
    attn.manual_seed(c.seed)
    local m = nn.MultiHeadAttentionWrapper(3, 1, 6, 0.0, 2)
    local out = m(attn.rand(c.x[1].shape))
    assert.are.same({2, 6, 2}, out:size())
    C.close(out, c.out, 0, TOL, "exercise 3.2 output")
  end)

  it("exercise 3.1: SelfAttentionV2's Linear weights copied transposed into SelfAttentionV1 give V2's output", function()
    for _, c in ipairs(F.cases.SelfAttentionV2) do
      if not c.qkv_bias then
        attn.manual_seed(c.seed)
        local v2 = nn.SelfAttentionV2(c.args[1], c.args[2])
        local x = attn.rand(c.x[1].shape)
        attn.manual_seed(c.seed + 1)
        local v1 = nn.SelfAttentionV1(c.args[1], c.args[2])
        -- before the copy V1 (its own attn.rand weights) computes something else
        assert.has_error(function() C.close(v1(x), c.out, 0, TOL) end)
        attn.no_grad(function() -- parameters require grad: in-place edits go inside no_grad, as in torch
          v1.W_query:copy_(v2.W_query.weight:t())
          v1.W_key:copy_(v2.W_key.weight:t())
          v1.W_value:copy_(v2.W_value.weight:t())
        end)
        C.close(v1(x), c.out, 0, TOL, "SelfAttentionV1 with V2's weights (seed " .. c.seed .. ")")
        C.close(v2(x), c.out, 0, TOL, "SelfAttentionV2 (seed " .. c.seed .. ")")
        C.close(v1(x), {shape = c.out.shape, data = C.flat(v2(x))}, 0, 1e-6, "V1 vs V2")
      end
    end
  end)
end)

describe("attn.nn modules reproduce notebook 002's printed tensors (values copied from the notebook)", function()
  local inputs = attn.tensor({{0.43, 0.15, 0.89}, {0.55, 0.87, 0.66}, {0.57, 0.85, 0.64},
                              {0.22, 0.58, 0.33}, {0.77, 0.25, 0.10}, {0.05, 0.80, 0.55}})
  local batch = attn.stack({inputs, inputs}, 1)
  -- the notebook prints 4 decimals: agreement within half a unit of the last one (plus float noise)
  local PRINT_TOL = 5.01e-5
  local function twice(rows)
    local data = {}
    for _ = 1, 2 do for _, r in ipairs(rows) do for _, v in ipairs(r) do data[#data + 1] = v end end end
    return {shape = {2, #rows, #rows[1]}, data = data}
  end

  it("CausalAttention(3, 2, 6, 0.0), seed 123", function()
    attn.manual_seed(123)
    local ca = nn.CausalAttention(3, 2, 6, 0.0)
    C.close(ca(batch), twice({{-0.4519, 0.2216}, {-0.5874, 0.0058}, {-0.6300, -0.0632},
                              {-0.5675, -0.0843}, {-0.5526, -0.0981}, {-0.5299, -0.1081}}), 0, PRINT_TOL)
  end)

  it("MultiHeadAttention(3, 2, 6, 0.0, 2), seed 123: the notebook's stale 1/sqrt(2) scale, via {scale = ...}", function()
    attn.manual_seed(123)
    local m = nn.MultiHeadAttention(3, 2, 6, 0.0, 2, {scale = 1 / math.sqrt(2)})
    local want = twice({{0.3190, 0.4858}, {0.2941, 0.3906}, {0.2854, 0.3600},
                        {0.2692, 0.3879}, {0.2636, 0.3935}, {0.2574, 0.4033}})
    C.close(m(batch), want, 0, PRINT_TOL)
    -- the default head_dim scale (1/sqrt(1)) keeps the first row and moves later ones
    attn.manual_seed(123)
    local fixed = nn.MultiHeadAttention(3, 2, 6, 0.0, 2)
    local out = fixed(batch)
    C.close(out:narrow(2, 1, 1), {shape = {2, 1, 2}, data = {0.3190, 0.4858, 0.3190, 0.4858}}, 0, PRINT_TOL)
    assert.has_error(function() C.close(out, want, 0, PRINT_TOL) end)
  end)
end)
