--- Hugging Face GPT-2 weights for nn.GPTModel: `GPTModel.from_pretrained(path)`
-- and `model:save_pretrained(dir)` (installed on GPTModel by GPTModel.lua).
--
-- The layout is the one of Hugging Face's published `gpt2` model.safetensors
-- (GPT2LMHeadModel, keys as GPT2Model names them): `wte.weight` [vocab, emb],
-- `wpe.weight` [context, emb], per layer N `h.N.ln_1.{weight,bias}`,
-- `h.N.attn.c_attn.{weight,bias}` ([emb, 3 emb]: query, key, value side by
-- side; Conv1D stores [in, out], the transpose of nn.Linear's weight),
-- `h.N.attn.c_proj`, `h.N.ln_2`, `h.N.mlp.c_fc` ([emb, 4 emb]),
-- `h.N.mlp.c_proj`, `ln_f`; `lm_head.weight` optional (GPT-2 ties it to wte).
-- Keys may carry the `transformer.` prefix (GPT2LMHeadModel's state_dict);
-- the causal-mask buffers `h.N.attn.bias` / `h.N.attn.masked_bias` are
-- ignored. Token id i here is Hugging Face's (and tiktoken's) id i - 1, so
-- the rows of wte are used as they are.
-- @module attn.nn.gpt2_pretrained
local attn = require "attn"
local caller = require "attn.caller"

local M = {}

-- JSON null (a value distinct from a missing key)
local NULL = setmetatable({}, {__name = "json null"})

local FROM = "attn.nn.GPTModel.from_pretrained"
local SAVE = "GPTModel:save_pretrained"

-- ------------------------------------------------------------------ JSON
-- config.json is plain JSON: a small reader and writer suffice

local function json_decode(text, fname, path)
  local pos = 1
  local function fail(what)
    caller.error(("%s: %s is not valid JSON (%s at byte %d)"):format(fname, path, what, pos))
  end
  local function skip() pos = text:find("[^ \t\r\n]", pos) or #text + 1 end
  local value
  local escapes = {['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t"}
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = text:sub(pos, pos)
      if c == "" then fail("unterminated string") end
      if c == '"' then pos = pos + 1; return table.concat(out) end
      if c == "\\" then
        local e = text:sub(pos + 1, pos + 1)
        if e == "u" then
          local hex = text:sub(pos + 2, pos + 5)
          if not hex:match("^%x%x%x%x$") then fail("bad \\u escape") end
          out[#out + 1] = utf8.char(tonumber(hex, 16))
          pos = pos + 6
        elseif escapes[e] then
          out[#out + 1] = escapes[e]
          pos = pos + 2
        else
          fail("bad escape")
        end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
  end
  function value()
    skip()
    local c = text:sub(pos, pos)
    if c == "{" then
      local obj = {}
      pos = pos + 1
      skip()
      if text:sub(pos, pos) == "}" then pos = pos + 1; return obj end
      while true do
        skip()
        if text:sub(pos, pos) ~= '"' then fail("expected a key") end
        local k = str()
        skip()
        if text:sub(pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        obj[k] = value()
        skip()
        local d = text:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return obj end
        if d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      local arr = {}
      pos = pos + 1
      skip()
      if text:sub(pos, pos) == "]" then pos = pos + 1; return arr end
      while true do
        arr[#arr + 1] = value()
        skip()
        local d = text:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return arr end
        if d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    end
    for word, v in pairs({["true"] = true, ["false"] = false, null = NULL}) do
      if text:sub(pos, pos + #word - 1) == word then pos = pos + #word; return v end
    end
    local num = text:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    if not num or not tonumber(num) then fail("unexpected character") end
    pos = pos + #num
    return math.tointeger(tonumber(num)) or tonumber(num)
  end
  local v = value()
  skip()
  if pos <= #text then fail("trailing text") end
  return v
end


-- the shortest %g form that reads back as x
local function json_number(x)
  if math.type(x) == "integer" then return tostring(x) end
  for digits = 1, 17 do
    local s = ("%." .. digits .. "g"):format(x)
    if tonumber(s) == x then return s end
  end
  return ("%.17g"):format(x)
end

-- an object with its keys in the given order, two-space indented as json.dump(indent=2)
local function json_object(keys, obj)
  local lines = {}
  for _, k in ipairs(keys) do
    local v = obj[k]
    local s
    if v == NULL then s = "null"
    elseif type(v) == "boolean" then s = tostring(v)
    elseif type(v) == "number" then s = json_number(v)
    elseif type(v) == "table" then s = '[\n    "' .. table.concat(v, '",\n    "') .. '"\n  ]'
    else s = ('"%s"'):format(v) end
    lines[#lines + 1] = ('  "%s": %s'):format(k, s)
  end
  return "{\n" .. table.concat(lines, ",\n") .. "\n}\n"
end

-- ------------------------------------------------------------------ reading

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function shape_str(t) return "[" .. table.concat(t:size(), ", ") .. "]" end

-- the sizes of the model from config.json: nil when there is none
local function read_config(path)
  local text = read_file(path)
  if not text then return nil end
  local cfg = json_decode(text, FROM, path)
  if type(cfg) ~= "table" or cfg == NULL or cfg[1] ~= nil then
    caller.error(("%s: %s is not a JSON object (a Hugging Face config.json)"):format(FROM, path))
  end
  local function int(key, alt)
    local v = cfg[key]
    if v == nil and alt then key, v = alt, cfg[alt] end
    if v == nil then return nil end
    if math.type(v) ~= "integer" or v < 1 then
      caller.error(("%s: %s: '%s' must be a positive integer, got %s"):format(FROM, path, key, tostring(v)))
    end
    return v
  end
  local out = {vocab_size = int("vocab_size"), n_positions = int("n_positions", "n_ctx"), n_embd = int("n_embd"),
               n_layer = int("n_layer"), n_head = int("n_head"), path = path}
  local act = cfg.activation_function
  if act ~= nil and act ~= "gelu_new" and act ~= "gelu_pytorch_tanh" then
    caller.error(("%s: %s: activation_function = %s is not GPT-2's (GPTModel has the tanh GELU: gelu_new)"):format(
      FROM, path, tostring(act)))
  end
  if cfg.n_inner ~= nil and cfg.n_inner ~= NULL and out.n_embd and cfg.n_inner ~= 4 * out.n_embd then
    caller.error(("%s: %s: n_inner = %s is not 4 * n_embd (GPTModel's feed-forward width)"):format(
      FROM, path, tostring(cfg.n_inner)))
  end
  for _, key in ipairs({"scale_attn_by_inverse_layer_idx", "add_cross_attention"}) do
    if cfg[key] == true then
      caller.error(("%s: %s: %s = true is not supported by GPTModel"):format(FROM, path, key))
    end
  end
  if cfg.scale_attn_weights == false then
    caller.error(("%s: %s: scale_attn_weights = false is not supported by GPTModel"):format(FROM, path))
  end
  local eps = cfg.layer_norm_epsilon
  if eps ~= nil and not (type(eps) == "number" and eps > 0 and eps < 1) then
    caller.error(("%s: %s: layer_norm_epsilon must be a number in (0, 1), got %s"):format(FROM, path, tostring(eps)))
  end
  out.eps = eps or 1e-5
  local p = cfg.resid_pdrop
  out.drop_rate = type(p) == "number" and p >= 0 and p <= 1 and p or 0
  out.tied = cfg.tie_word_embeddings ~= false
  return out
end

-- the safetensors file and the config.json beside it, from a file or a folder
local function locate(path)
  local st = path .. "/model.safetensors"
  local f = io.open(st, "rb")
  if f then
    f:close()
    return st, path .. "/config.json"
  end
  local dir = path:match("^(.*)/[^/]*$") or "."
  return path, dir .. "/config.json"
end

-- the tensors of a Hugging Face GPT-2 file by GPT2Model's names (no
-- "transformer." prefix), the causal-mask buffers dropped
local function hf_names(tensors, file)
  local out, from = {}, {}
  for key, t in pairs(tensors) do
    local name = key:gsub("^transformer%.", "")
    if not (name:match("^h%.%d+%.attn%.bias$") or name:match("^h%.%d+%.attn%.masked_bias$")) then
      if from[name] then
        local a, b = from[name], key
        if a > b then a, b = b, a end
        caller.error(("%s: %s holds both '%s' and '%s' (the same tensor with and without the 'transformer.' prefix)")
          :format(FROM, file, a, b))
      end
      out[name], from[name] = t, key
    end
  end
  return out, from
end

-- a and b hold the same values (the same tensor, or equal elementwise)
local function same_values(a, b)
  return a == b or attn.ne(a, b):sum():item() == 0
end

local LAYER_KEYS = {
  {"ln_1.weight", "d"}, {"ln_1.bias", "d"},
  {"attn.c_attn.weight", "d", "3d"}, {"attn.c_attn.bias", "3d"},
  {"attn.c_proj.weight", "d", "d"}, {"attn.c_proj.bias", "d"},
  {"ln_2.weight", "d"}, {"ln_2.bias", "d"},
  {"mlp.c_fc.weight", "d", "4d"}, {"mlp.c_fc.bias", "4d"},
  {"mlp.c_proj.weight", "4d", "d"}, {"mlp.c_proj.bias", "d"},
}

--- nn.GPTModel.from_pretrained(path): see GPTModel.lua.
function M.from_pretrained(GPTModel, path)
  if type(path) ~= "string" then
    caller.error(("%s: bad argument #1 'path' (expected a path to a model.safetensors file or its folder, got %s)")
      :format(FROM, path == GPTModel and "the GPTModel class (call it with '.', not ':')" or type(path)))
  end
  local file, config_path = locate(path)
  local ok, raw = pcall(attn.load_safetensors, file)
  if not ok then
    local msg = tostring(raw):gsub("^.-attn%.load_safetensors: ", "")
    if msg:find("(a directory)", 1, true) then msg = path .. " is a folder without a model.safetensors file" end
    caller.error(("%s: %s"):format(FROM, msg))
  end
  local w, from = hf_names(raw, file)
  local function key_of(name) return from[name] or name end
  local function need(name)
    if not w[name] then
      caller.error(("%s: %s is not a Hugging Face GPT-2 file: tensor '%s' is missing"):format(FROM, file, name))
    end
    return w[name]
  end
  local wte, wpe = need("wte.weight"), need("wpe.weight")
  if wte:dim() ~= 2 or wpe:dim() ~= 2 or wpe:size(2) ~= wte:size(2) then
    caller.error(("%s: %s: '%s' %s and '%s' %s must be [vocab, emb] and [context, emb]"):format(FROM, file,
      key_of("wte.weight"), shape_str(wte), key_of("wpe.weight"), shape_str(wpe)))
  end
  local V, P, d = wte:size(1), wpe:size(1), wte:size(2)
  local L = 0
  for name in pairs(w) do
    local n = name:match("^h%.(%d+)%.")
    if n then L = math.max(L, tonumber(n) + 1) end
  end
  if L == 0 then caller.error(("%s: %s: tensor 'h.0.ln_1.weight' is missing (no layers)"):format(FROM, file)) end

  local cfg = read_config(config_path)
  local H
  if cfg then
    for _, c in ipairs({{"vocab_size", V, "wte.weight"}, {"n_positions", P, "wpe.weight"}, {"n_embd", d, "wte.weight"},
                        {"n_layer", L, "h.N"}}) do
      if cfg[c[1]] and cfg[c[1]] ~= c[2] then
        caller.error(("%s: %s says %s = %d but %s has %d (from '%s')"):format(FROM, config_path, c[1], cfg[c[1]],
          file, c[2], c[3] == "h.N" and "the largest h.N" or key_of(c[3])))
      end
    end
    H = cfg.n_head
  end
  if not H then
    -- no config.json: GPT-2's heads are 64 wide at every size (768/12, 1024/16, 1280/20, 1600/25)
    if d % 64 ~= 0 then
      caller.error(("%s: no n_head: %s has no config.json beside it and emb = %d is not a multiple of GPT-2's head "
        .. "size 64 (put the model's config.json beside it)"):format(FROM, file, d))
    end
    H = d // 64
  end
  if d % H ~= 0 then
    caller.error(("%s: %s: n_embd = %d is not divisible by n_head = %d"):format(FROM, config_path, d, H))
  end

  -- every expected tensor with its shape, then nothing else
  local sizes = {d = d, ["3d"] = 3 * d, ["4d"] = 4 * d}
  local expected = {["wte.weight"] = true, ["wpe.weight"] = true}
  local function check(name, ...)
    expected[name] = true
    local t = need(name)
    local want = {...}
    local okshape = t:dim() == #want
    for i, s in ipairs(want) do okshape = okshape and t:size(i) == s end
    if not okshape then
      caller.error(("%s: %s: tensor '%s' has shape %s, expected [%s]"):format(FROM, file, key_of(name), shape_str(t),
        table.concat(want, ", ")))
    end
    return t
  end
  for i = 0, L - 1 do
    for _, k in ipairs(LAYER_KEYS) do
      local dims = {}
      for j = 2, #k do dims[j - 1] = sizes[k[j]] end
      check(("h.%d.%s"):format(i, k[1]), table.unpack(dims))
    end
  end
  check("ln_f.weight", d)
  check("ln_f.bias", d)
  local lm_head = w["lm_head.weight"] and check("lm_head.weight", V, d)
  local extra = {}
  for name in pairs(w) do
    if not expected[name] then extra[#extra + 1] = key_of(name) end
  end
  if #extra > 0 then
    table.sort(extra)
    caller.error(("%s: %s: unexpected tensor '%s' (not part of GPT-2's layout)"):format(FROM, file, extra[1]))
  end
  if V > 1 << 24 or P > 1 << 24 then
    caller.error(("%s: %s: vocab %d or context %d exceeds 2^24 (ids are float32)"):format(FROM, file, V, P))
  end

  -- everything checked: build and copy. Every parameter is overwritten below,
  -- so the constructor's random draws (uniform_, normal_: most of the time of
  -- a 124M model's load) are skipped, which also leaves the global generator
  -- as it was
  local Tensor = attn.Tensor
  local uniform_, normal_ = Tensor.uniform_, Tensor.normal_
  local function undrawn(t) return t end
  Tensor.uniform_, Tensor.normal_ = undrawn, undrawn
  local built, model = pcall(GPTModel, {vocab_size = V, context_length = P, emb_dim = d, n_heads = H, n_layers = L,
                                         drop_rate = cfg and cfg.drop_rate or 0, qkv_bias = true})
  Tensor.uniform_, Tensor.normal_ = uniform_, normal_
  if not built then error(model, 0) end
  local eps = cfg and cfg.eps or 1e-5
  attn.no_grad(function()
    model.tok_emb.weight:copy_(wte)
    model.pos_emb.weight:copy_(wpe)
    for i = 1, L do
      local p = ("h.%d."):format(i - 1)
      local blk = model.trf_blocks[i]
      local qkv_w, qkv_b = w[p .. "attn.c_attn.weight"], w[p .. "attn.c_attn.bias"]
      for j, lin in ipairs({blk.att.W_query, blk.att.W_key, blk.att.W_value}) do
        lin.weight:copy_(qkv_w:narrow(2, (j - 1) * d + 1, d):t())
        lin.bias:copy_(qkv_b:narrow(1, (j - 1) * d + 1, d))
      end
      blk.att.out_proj.weight:copy_(w[p .. "attn.c_proj.weight"]:t())
      blk.att.out_proj.bias:copy_(w[p .. "attn.c_proj.bias"])
      blk.norm1.scale:copy_(w[p .. "ln_1.weight"])
      blk.norm1.shift:copy_(w[p .. "ln_1.bias"])
      blk.norm2.scale:copy_(w[p .. "ln_2.weight"])
      blk.norm2.shift:copy_(w[p .. "ln_2.bias"])
      blk.norm1.eps, blk.norm2.eps = eps, eps
      local fc, proj = blk.ff.layers[1], blk.ff.layers[3]
      fc.weight:copy_(w[p .. "mlp.c_fc.weight"]:t())
      fc.bias:copy_(w[p .. "mlp.c_fc.bias"])
      proj.weight:copy_(w[p .. "mlp.c_proj.weight"]:t())
      proj.bias:copy_(w[p .. "mlp.c_proj.bias"])
    end
    model.final_norm.scale:copy_(w["ln_f.weight"])
    model.final_norm.shift:copy_(w["ln_f.bias"])
    model.final_norm.eps = eps
  end)
  -- tied as GPT-2 (one tensor, listed once by parameters()) unless the file
  -- and its config keep a separate lm_head
  local untied = lm_head and ((cfg and not cfg.tied) or not same_values(lm_head, wte))
  if untied then
    attn.no_grad(function() model.out_head.weight:copy_(lm_head) end)
  else
    model.out_head.weight = model.tok_emb.weight
  end
  model:eval()
  return model
end

-- ------------------------------------------------------------------ writing

--- model:save_pretrained(dir): see GPTModel.lua.
function M.save_pretrained(model, dir)
  if type(dir) ~= "string" or dir == "" then
    caller.error(("%s: bad argument #1 'dir' (expected the path of an existing folder, got %s)"):format(SAVE,
      type(dir) == "string" and '""' or type(dir)))
  end
  local cfg = model.cfg
  if not cfg.qkv_bias then
    caller.error(("%s: GPT-2's layout has query, key and value biases: the model was built with qkv_bias = false")
      :format(SAVE))
  end
  local d, L = cfg.emb_dim, cfg.n_layers
  local t = {}
  local tied = same_values(model.out_head.weight, model.tok_emb.weight)
  attn.no_grad(function()
    t["wte.weight"] = model.tok_emb.weight
    t["wpe.weight"] = model.pos_emb.weight
    for i = 1, L do
      local p = ("h.%d."):format(i - 1)
      local blk = model.trf_blocks[i]
      local a = blk.att
      t[p .. "attn.c_attn.weight"] = attn.cat({a.W_query.weight:t(), a.W_key.weight:t(), a.W_value.weight:t()}, 2)
      t[p .. "attn.c_attn.bias"] = attn.cat({a.W_query.bias, a.W_key.bias, a.W_value.bias}, 1)
      t[p .. "attn.c_proj.weight"] = a.out_proj.weight:t():contiguous()
      t[p .. "attn.c_proj.bias"] = a.out_proj.bias
      t[p .. "ln_1.weight"], t[p .. "ln_1.bias"] = blk.norm1.scale, blk.norm1.shift
      t[p .. "ln_2.weight"], t[p .. "ln_2.bias"] = blk.norm2.scale, blk.norm2.shift
      local fc, proj = blk.ff.layers[1], blk.ff.layers[3]
      t[p .. "mlp.c_fc.weight"], t[p .. "mlp.c_fc.bias"] = fc.weight:t():contiguous(), fc.bias
      t[p .. "mlp.c_proj.weight"], t[p .. "mlp.c_proj.bias"] = proj.weight:t():contiguous(), proj.bias
    end
    t["ln_f.weight"], t["ln_f.bias"] = model.final_norm.scale, model.final_norm.shift
    if not tied then t["lm_head.weight"] = model.out_head.weight end
  end)
  local ok, err = pcall(attn.save_safetensors, dir .. "/model.safetensors", t, {format = "pt"})
  if not ok then caller.error(("%s: %s"):format(SAVE, (tostring(err):gsub("^.-attn%.save_safetensors: ", "")))) end
  local config = {
    activation_function = "gelu_new", architectures = {"GPT2LMHeadModel"}, attn_pdrop = cfg.drop_rate,
    embd_pdrop = cfg.drop_rate, layer_norm_epsilon = model.final_norm.eps, model_type = "gpt2",
    n_ctx = cfg.context_length, n_embd = d, n_head = cfg.n_heads, n_inner = NULL, n_layer = L,
    n_positions = cfg.context_length, resid_pdrop = cfg.drop_rate, tie_word_embeddings = tied,
    vocab_size = cfg.vocab_size,
  }
  local keys = {}
  for k in pairs(config) do keys[#keys + 1] = k end
  table.sort(keys)
  local path = dir .. "/config.json"
  local f, ferr = io.open(path, "wb")
  if not f then caller.error(("%s: cannot write %s (%s)"):format(SAVE, path, tostring(ferr))) end
  f:write(json_object(keys, config))
  f:close()
end

return M
