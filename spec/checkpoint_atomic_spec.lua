-- Loads that never half-happen: attn.checkpoint.load, m:load_state_dict and
-- opt:load_state_dict check everything before they change anything (a
-- broken load leaves the parameters, the optimizer's state and the generator
-- bit for bit as they were); checkpoint extra values come back with their
-- types; an optimizer refuses a step count that is not an exact integer in
-- [0, 2^53].
local attn = require "attn"
local checkpoint = require "attn.checkpoint"
local C = dofile("spec/fixtures/tensor_check.lua")
local F = attn.nn.functional

local CFG = {vocab_size = 32, context_length = 4, emb_dim = 8, n_heads = 2, n_layers = 1, drop_rate = 0,
             qkv_bias = false}

local function tmpname()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".safetensors"
end

local function train_step(model, opt, seed)
  local ids = {}
  for i, v in ipairs(C.lcg(seed, 5)) do ids[i] = math.floor((v + 1) * 16) % 32 + 1 end
  local x = attn.tensor({{ids[1], ids[2], ids[3], ids[4]}})
  local y = attn.tensor({ids[2], ids[3], ids[4], ids[5]})
  local loss = F.cross_entropy(model(x):view(4, 32), y)
  opt:zero_grad()
  loss:backward()
  opt:step()
end

-- a model and its AdamW after `steps` steps, from seed
local function trained(seed, steps)
  attn.manual_seed(seed)
  local m = attn.nn.GPTModel(CFG)
  local opt = attn.optim.AdamW(m:parameters(), {lr = 1e-2})
  for s = 1, steps do train_step(m, opt, seed * 10 + s) end
  return m, opt
end

-- every bit a load could change: parameters, optimizer options and state, generator
local function snapshot(m, opt)
  local snap = {params = {}, groups = {}, state = {}, rng = attn.get_rng_state()}
  for _, np in ipairs(m:named_parameters()) do snap.params[np[1]] = C.bits(np[2]) end
  if opt then
    local sd = opt:state_dict()
    for g, group in ipairs(sd.param_groups) do
      snap.groups[g] = {lr = group.lr, weight_decay = group.weight_decay, eps = group.eps,
                        beta1 = group.betas[1], beta2 = group.betas[2]}
    end
    for i, s in pairs(sd.state) do
      snap.state[i] = {step = s.step, math_type = math.type(s.step), exp_avg = C.bits(s.exp_avg),
                       exp_avg_sq = C.bits(s.exp_avg_sq)}
    end
  end
  return snap
end

-- the good checkpoint's contents, changed by edit(tensors, meta), written to a new file
local function broken_copy(path, edit)
  local tensors, meta = attn.load_safetensors(path)
  edit(tensors, meta)
  local out = tmpname()
  attn.save_safetensors(out, tensors, meta)
  return out
end

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end

describe("attn.checkpoint.load is all or nothing", function()
  local good
  setup(function()
    local m, opt = trained(3, 2)
    good = tmpname()
    checkpoint.save(good, m, opt, {step = 2, tag = "run-a", plan = {1, 2, {lr = 0.5}}})
  end)
  teardown(function() os.remove(good) end)

  -- each: what is broken, the edit of the file's contents, the words of the error
  local cases = {
    {"a missing model tensor", function(t) t["model.out_head.weight"] = nil end, "missing key(s)", "out_head.weight"},
    {"a model tensor of the wrong shape", function(t) t["model.final_norm.scale"] = attn.zeros(9) end,
      "size mismatch for \"final_norm.scale\""},
    {"an optimizer moment of the wrong shape", function(t) t["optim.3.exp_avg"] = attn.zeros(2, 2) end,
      "state 'exp_avg' of parameter 3 has shape [2, 2]"},
    {"optimizer state for a parameter no group lists", function(t) t["optim.999.exp_avg"] = attn.zeros(1) end,
      "state for parameter 999, which no param group lists"},
    {"an optimizer option out of range", function(_, meta) meta["optim.group.1.lr"] = "-1" end, "bad option 'lr'"},
    {"an optimizer option of the wrong type", function(_, meta) meta["optim.group.1.lr"] = "fast" end,
      "optimizer option 'lr' of group 1 is missing or unreadable"},
    {"a negative optimizer step", function(_, meta) meta["optim.state.1.step"] = "-1" end,
      "bad state 'step' of parameter 1", "got -1"},
    {"a fractional optimizer step", function(_, meta) meta["optim.state.2.step"] = "1.5" end,
      "bad state 'step' of parameter 2", "got 1.5"},
    {"an optimizer step that is not a number", function(_, meta) meta["optim.state.2.step"] = "two" end,
      "bad state 'step' of parameter 2", "got \"two\""},
    {"an optimizer step tensor of two elements", function(t, meta)
      meta["optim.state.1.step"] = nil
      t["optim.1.step"] = attn.tensor({1, 2})
    end, "bad state 'step' of parameter 1", "got a tensor of shape [2]"},
    {"optimizer state without its step", function(_, meta) meta["optim.state.4.step"] = nil end,
      "state of parameter 4: 'step' is missing"},
    {"a generator state of the wrong length", function(_, meta) meta.rng = meta.rng:sub(1, 200) end,
      "the generator state (metadata 'rng') is unusable", "expected a state of 2524 bytes"},
    {"a corrupt generator state", function(_, meta)
      meta.rng = hex("XXXX") .. meta.rng:sub(9)
    end, "the generator state (metadata 'rng') is unusable", "bad header"},
    {"a generator state that is not hex", function(_, meta) meta.rng = "zz" end,
      "the generator state (metadata 'rng') is missing or not hex"},
    {"a config value of another type", function(_, meta) meta["cfg.emb_dim"] = "wide" end,
      "saved from another config", "emb_dim = wide there, 8 here"},
    {"a damaged extra table", function(_, meta) meta["extra.plan"] = "{i1;i1;i2;" end,
      "extra 'plan' is unreadable as a table"},
    {"an extra integer that is not one", function(_, meta) meta["extra.step"] = "2.5" end,
      "extra 'step' is unreadable as a integer"},
    {"an extra of an unknown type", function(_, meta) meta["extra_type.tag"] = "complex" end,
      "extra 'tag' is unreadable", "an unknown type \"complex\""},
  }
  for _, case in ipairs(cases) do
    it(("%s: an error, and the model, the optimizer and the generator are as they were"):format(case[1]), function()
      local path = broken_copy(good, case[2])
      local m, opt = trained(5, 1)   -- another model, optimizer state and generator state
      local before = snapshot(m, opt)
      C.fails(function() checkpoint.load(path, m, opt) end, "attn.checkpoint.load: " .. path,
        table.unpack(case, 3))
      assert.are.same(before, snapshot(m, opt))
      os.remove(path)
    end)
  end

  it("a truncated file: an error, nothing changed", function()
    local f = assert(io.open(good, "rb"))
    local bytes = f:read("a")
    f:close()
    local path = tmpname()
    f = assert(io.open(path, "wb"))
    f:write(bytes:sub(1, #bytes - 100))
    f:close()
    local m, opt = trained(5, 1)
    local before = snapshot(m, opt)
    C.fails(function() checkpoint.load(path, m, opt) end, "attn.checkpoint.load: ")
    assert.are.same(before, snapshot(m, opt))
    os.remove(path)
  end)

  it("a model-only load with a broken generator state changes nothing", function()
    local path = broken_copy(good, function(_, meta) meta.rng = meta.rng:sub(1, 64) end)
    local m = trained(5, 0)
    local before = snapshot(m)
    C.fails(function() checkpoint.load(path, m) end, "the generator state (metadata 'rng') is unusable")
    assert.are.same(before, snapshot(m))
    os.remove(path)
  end)

  it("the good checkpoint then loads whole: the saved bits, state and generator", function()
    local saved_m, saved_opt = trained(3, 2)
    local expected = snapshot(saved_m, saved_opt)
    local m, opt = trained(5, 1)
    local extra = checkpoint.load(good, m, opt)
    expected.rng = attn.get_rng_state()   -- the generator comes from the file: compared below
    assert.are.same(expected, snapshot(m, opt))
    local _, meta = attn.load_safetensors(good)
    assert.are.equal(meta.rng, hex(attn.get_rng_state()))
    assert.are.equal(2, extra.step)
  end)
end)

describe("m:load_state_dict and opt:load_state_dict check everything, then apply", function()
  it("m:load_state_dict with its last entry bad copies none of the others", function()
    local m = trained(5, 0)
    local src = trained(6, 0)
    local d, keys = src:state_dict(), m:state_dict_keys()
    d[keys[#keys]] = attn.zeros(3)
    local before = snapshot(m)
    C.fails(function() m:load_state_dict(d) end, "GPTModel:load_state_dict", "size mismatch for \"" .. keys[#keys])
    assert.are.same(before, snapshot(m))
    d[keys[#keys]] = "not a tensor"
    C.fails(function() m:load_state_dict(d) end, "value for \"" .. keys[#keys] .. "\" is not an attn.Tensor")
    assert.are.same(before, snapshot(m))
  end)

  it("m:load_state_dict into a module whose last tensor is an expanded view copies none of the others", function()
    local m = attn.nn.Linear(4, 2)
    m.bias = attn.zeros(1):expand(2)   -- copy_ refuses to write there
    local before = C.bits(m.weight)
    C.fails(function() m:load_state_dict({weight = attn.ones(2, 4), bias = attn.ones(2)}) end,
      "Linear:load_state_dict", "the module's \"bias\" (shape [2]) is an expanded view whose elements share memory")
    assert.are.same(before, C.bits(m.weight))
    assert.is_true(attn.zeros(1):expand(3):has_internal_overlap())
    assert.is_false(attn.zeros(2, 3):t():has_internal_overlap())
    -- a stride of 0 along a dim of size 1 overlaps nothing; along 2 it does
    assert.is_false(attn.zeros(3, 1):expand(3, 1):has_internal_overlap())
    assert.is_true(attn.zeros(3, 1):expand(3, 2):has_internal_overlap())
    C.fails(function() return attn.Tensor.has_internal_overlap(5) end,
      "Tensor:has_internal_overlap: bad argument #1 'self' (expected attn.Tensor, got number)")
  end)

  it("attn.check_rng_state accepts what get_rng_state gives and leaves the generator as it was", function()
    attn.manual_seed(11)
    local state = attn.get_rng_state()
    attn.manual_seed(5)
    local want = attn.rand(4)           -- the draws of seed 5, no check in between
    attn.manual_seed(5)
    assert.is_true(attn.check_rng_state(state))
    assert.are.same(C.bits(want), C.bits(attn.rand(4)))
    C.fails(function() attn.check_rng_state(42) end,
      "attn.check_rng_state: bad argument #1 'state' (expected a string from attn.get_rng_state, got number)")
    C.fails(function() attn.check_rng_state(state:sub(1, 10)) end, "attn.check_rng_state")
    attn.manual_seed(5)
    pcall(attn.check_rng_state, state:sub(1, 10))
    assert.are.same(C.bits(want), C.bits(attn.rand(4)))  -- a refused state changes nothing either
  end)

  it("m:prepare_load_state_dict checks and changes nothing until its function is called", function()
    local m = trained(5, 0)
    local src = trained(6, 0)
    local before, wanted = snapshot(m), snapshot(src)
    local apply, result = m:prepare_load_state_dict(src:state_dict())
    assert.are.same({missing_keys = {}, unexpected_keys = {}}, result)
    assert.are.same(before.params, snapshot(m).params)
    apply()
    assert.are.same(wanted.params, snapshot(m).params)
    C.fails(function() m:prepare_load_state_dict({}) end, "GPTModel:load_state_dict", "missing key(s)")
  end)

  it("opt:prepare_load_state_dict checks and changes nothing until its function is called", function()
    local m, opt = trained(5, 1)
    local src_m, src = trained(6, 2)
    local before, wanted = snapshot(m, opt), snapshot(src_m, src)
    local apply = opt:prepare_load_state_dict(src:state_dict())
    assert.are.same(before, snapshot(m, opt))
    apply()
    local after = snapshot(m, opt)
    assert.are.same(wanted.state, after.state)
    assert.are.same(wanted.groups, after.groups)
    C.fails(function() opt:prepare_load_state_dict({state = {}, param_groups = {}}) end,
      "attn.optim.AdamW:load_state_dict", "the state dict has 0 param group(s), the optimizer 1")
  end)

  it("opt:load_state_dict with its last parameter's state bad changes no option and no state", function()
    local _, opt = trained(5, 1)
    local _, src = trained(6, 2)
    local sd = src:state_dict()
    sd.param_groups[1].lr = 0.5
    local last = #src.param_groups[1].params
    sd.state[last].exp_avg_sq = attn.zeros(1)
    local m = trained(5, 0)
    local before = snapshot(m, opt)
    C.fails(function() opt:load_state_dict(sd) end, "attn.optim.AdamW:load_state_dict",
      ("state 'exp_avg_sq' of parameter %d has shape [1]"):format(last))
    assert.are.same(before, snapshot(m, opt))
  end)
end)

describe("checkpoint extra values come back with their types", function()
  local m = attn.nn.Linear(3, 2)

  local function round_trip(extra)
    local path = tmpname()
    checkpoint.save(path, m, nil, extra)
    local back = checkpoint.load(path, m)
    os.remove(path)
    return back
  end

  it("strings that look like numbers stay strings; integers, floats and booleans keep their types", function()
    local back = round_trip({hex = "0x1A", sci = "1e3", digits = "12", empty = "", one = 1.0, three = 3,
      tenth = 0.1, big = math.maxinteger, small = math.mininteger, yes = true, no = false,
      inf = math.huge, ninf = -math.huge, nan = 0 / 0, nzero = -0.0, tiny = 5e-324})
    for k, v in pairs({hex = "0x1A", sci = "1e3", digits = "12", empty = ""}) do
      assert.are.equal("string", type(back[k]), k)
      assert.are.equal(v, back[k], k)
    end
    for k, v in pairs({one = 1.0, tenth = 0.1, inf = math.huge, ninf = -math.huge, tiny = 5e-324}) do
      assert.are.equal("float", math.type(back[k]), k)
      assert.are.equal(v, back[k], k)
    end
    assert.are.equal("float", math.type(back.nan))
    assert.is_true(back.nan ~= back.nan)
    assert.are.equal("float", math.type(back.nzero))
    assert.are.equal(-math.huge, 1 / back.nzero)   -- the sign of -0.0 kept
    for k, v in pairs({three = 3, big = math.maxinteger, small = math.mininteger}) do
      assert.are.equal("integer", math.type(back[k]), k)
      assert.are.equal(v, back[k], k)
    end
    assert.are.equal(true, back.yes)
    assert.are.equal(false, back.no)
  end)

  it("nested tables come back as they were, their values with their types", function()
    local plan = {1, 2.0, "3", true, {lr = 0.5, steps = {10, 20}, ["a key"] = false}, [7] = -1, [2.5] = "half",
                  [true] = "t", ["0x1A"] = "0x1A"}
    local back = round_trip({plan = plan, empty = {}})
    assert.are.same(plan, back.plan)
    assert.are.same({}, back.empty)
    assert.are.equal("integer", math.type(back.plan[1]))
    assert.are.equal("float", math.type(back.plan[2]))
    assert.are.equal("string", type(back.plan[3]))
    assert.are.equal("float", math.type(back.plan[5].lr))
    assert.are.equal("integer", math.type(back.plan[5].steps[2]))
  end)

  it("a value that cannot be written is an error at save naming the key", function()
    local path = tmpname()
    local function save(extra) return function() checkpoint.save(path, m, nil, extra) end end
    C.fails(save({hook = print}), "attn.checkpoint.save: bad argument #4 'extra'",
      "extra.hook: expected a string, number, boolean or table of them, got a function")
    C.fails(save({w = {attn.ones(1)}}),
      "extra.w[1]: expected a string, number, boolean or table of them, got an attn.Tensor")
    C.fails(save({bytes = "\xff\xfe"}), "extra.bytes: expected a string of valid UTF-8")
    C.fails(save({deep = {inner = {x = io.stdout}}}), "extra.deep.inner.x:", "got a userdata")
    local cycle = {}
    cycle.again = cycle
    C.fails(save({c = {cycle}}), "extra.c[1].again: expected a table without cycles")
    C.fails(save({k = {[{}] = 1}}), "extra.k: expected string, number or boolean keys, got a table key")
    C.fails(save({[1] = "x"}), "expected string keys of valid UTF-8, got the number key 1")
    local deep = {}
    local t, parent = deep, nil
    for _ = 1, 100 do t.next = {}; parent, t = t, t.next end   -- 101 tables
    C.fails(save({deep = deep}), "extra.deep.next.next", "...: expected tables nested at most 100 deep, got deeper")
    parent.next = nil
    assert.is_nil(io.open(path, "rb"))   -- nothing was written
    -- 100 levels in all are fine
    local back = round_trip({deep = deep})
    local depth, node = 0, back.deep
    while node.next do depth, node = depth + 1, node.next end
    assert.are.equal(99, depth)
  end)

  it("a checkpoint without recorded types (written before they were) reads numbers as numbers", function()
    local path = tmpname()
    checkpoint.save(path, m, nil, {step = 7, name = "run"})
    local tensors, meta = attn.load_safetensors(path)
    meta["extra_type.step"], meta["extra_type.name"] = nil, nil
    attn.save_safetensors(path, tensors, meta)
    local back = checkpoint.load(path, m)
    assert.are.equal(7, back.step)
    assert.are.equal("run", back.name)
    os.remove(path)
  end)
end)

describe("optimizer load_state_dict refuses a step that is not an exact integer in range", function()
  -- an Adam / AdamW with state after 3 steps over two parameters
  local function stepped(name)
    local params = {C.lcg_tensor(1, 1, 2, 3):requires_grad_(), C.lcg_tensor(2, 1, 4):requires_grad_()}
    local opt = attn.optim[name](params, {lr = 0.01})
    for s = 1, 3 do
      opt:zero_grad()
      for k, p in ipairs(params) do (p * C.lcg_tensor(10 * s + k, 1, table.unpack(p:size()))):sum():backward() end
      opt:step()
    end
    return params, opt
  end

  for _, name in ipairs({"Adam", "AdamW"}) do
    local bad = {
      {0 / 0, "got %-?nan"}, {1.5, "got 1.5"}, {-1, "got %-1"}, {2 ^ 53 + 2, "got 9007199254740994"},
      {math.maxinteger, "got 9223372036854775807"}, {1e300, "got 1.0000000000000001e%+300"},
      {"3", "got \"3\""}, {true, "got true"}, {attn.tensor({3, 3}), "got a tensor of shape %[2%]"},
      {attn.tensor(2.5), "got a tensor holding 2.5"},
    }
    for _, b in ipairs(bad) do
      it(("%s: step = %s is an error naming the parameter and the field, nothing changed"):format(name,
        attn.is_tensor(b[1]) and "a tensor " .. tostring(b[1]):gsub("\n", " ") or tostring(b[1])), function()
        local _, opt = stepped(name)
        local _, other = stepped(name)
        local sd = other:state_dict()
        sd.state[2].step = b[1]
        local before = {step1 = opt.state[opt.param_groups[1].params[1]].step,
                        m2 = C.bits(opt.state[opt.param_groups[1].params[2]].exp_avg)}
        local msg = C.fails(function() opt:load_state_dict(sd) end,
          ("attn.optim.%s:load_state_dict: bad state 'step' of parameter 2 (expected an integer in [0, 2^53]")
          :format(name))
        assert(msg:find(b[2]), msg)
        assert.are.same(before, {step1 = opt.state[opt.param_groups[1].params[1]].step,
                                 m2 = C.bits(opt.state[opt.param_groups[1].params[2]].exp_avg)})
      end)
    end

    it(name .. ": a float step 3.0, 2^53, and PyTorch 1.13's step tensor (float32, shape []) load as integers",
      function()
      for _, v in ipairs({3.0, 2 ^ 53, attn.tensor(3)}) do
        local _, opt = stepped(name)
        local sd = opt:state_dict()
        sd.state[1].step = v
        opt:load_state_dict(sd)
        local s = opt.state[opt.param_groups[1].params[1]]
        assert.are.equal("integer", math.type(s.step))
        assert.are.equal(attn.is_tensor(v) and 3 or v, s.step)
      end
    end)

    it(name .. ": resumed from a state dict whose steps are PyTorch's tensors, the bits of the run that never stopped",
      function()
        local params, opt = stepped(name)
        local sd = opt:state_dict()
        for _, s in pairs(sd.state) do s.step = attn.tensor(s.step) end   -- torch 1.13: state['step'] is tensor(3.)
        local params2 = {params[1]:detach():clone():requires_grad_(), params[2]:detach():clone():requires_grad_()}
        local opt2 = attn.optim[name](params2, {lr = 0.01})
        opt2:load_state_dict(sd)
        opt:zero_grad()
        for _, ps in ipairs({params, params2}) do
          for k, p in ipairs(ps) do (p * C.lcg_tensor(40 + k, 1, table.unpack(p:size()))):sum():backward() end
        end
        opt:step()
        opt2:step()
        for k = 1, 2 do C.same_bits(params2[k], params[k], "param " .. k) end
      end)
  end
end)
