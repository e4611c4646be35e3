-- attn.save_safetensors / attn.load_safetensors and Module:save / Module:load.
-- References: files PyTorch wrote (scripts/fixtures/make_safetensors_fixtures.py
-- wrote spec/fixtures/safetensors/ and spec/fixtures/safetensors_expected.lua),
-- byte layouts built here with string.pack, and malformed files built here.
local attn = require "attn"
require "attn.assert"

local nn = attn.nn
local DIR = "spec/fixtures/safetensors/"
local expected = dofile("spec/fixtures/safetensors_expected.lua")

local function tmpname(ext)
  local p = os.tmpname()
  os.remove(p)
  return p .. (ext or ".safetensors")
end

local function read_bytes(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local flat = dofile("spec/fixtures/tensor_check.lua").flat

-- bit-exact: NaN matches NaN, zeros keep their sign
local function check_exact(t, shape, data)
  assert.are.same(shape, t:dim() == 0 and {} or t:size())
  local got = flat(t)
  assert.are.equal(#data, #got)
  for i = 1, #got do
    if data[i] ~= data[i] then
      assert.is_true(got[i] ~= got[i], "element " .. i .. " should be NaN")
    else
      assert.are.equal(data[i], got[i])
      assert.are.equal(1 / data[i] > 0, 1 / got[i] > 0, "sign of element " .. i)
    end
  end
end

local function same_bits(a, b)
  check_exact(a, b:dim() == 0 and {} or b:size(), flat(b))
end

local function expect_error(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  for _, piece in ipairs({ ... }) do
    assert.is_truthy(string.find(err, piece, 1, true), "expected '" .. piece .. "' in: " .. err)
  end
  return err
end

-- a safetensors file: 8-byte little-endian length, the header as given, the data
local function st_bytes(header, data)
  return string.pack("<I8", #header) .. header .. (data or "")
end

local function floats(...)
  return string.pack("<" .. string.rep("f", select("#", ...)), ...)
end

describe("attn.load_safetensors on files PyTorch wrote", function()
  it("reads every tensor of plain.safetensors bit-exactly (F32, F64, F16, BF16, 0-dim, empty, escaped names)", function()
    local d, meta = attn.load_safetensors(DIR .. "plain.safetensors")
    local n = 0
    for name, fix in pairs(expected.tensors) do
      assert.is_not_nil(d[name], "missing tensor " .. name)
      check_exact(d[name], fix.shape, fix.data)
      assert.is_true(d[name]:is_contiguous())
      n = n + 1
    end
    local m = 0
    for _ in pairs(d) do m = m + 1 end
    assert.are.equal(n, m)
    assert.are.same(expected.metadata, meta)
  end)

  it("converts as torch's .float() does: F64 1/3 rounded, 1e39 -> inf; F16 subnormal 2^-24 exact", function()
    local d = attn.load_safetensors(DIR .. "plain.safetensors")
    assert.are.equal(0x1.555556p-2, d.f64[1][1])
    assert.are.equal(math.huge, d.f64[2][1])
    assert.are.equal(2 ^ -24, d.f16[2][1])
    assert.are.equal(65504, d.f16[2][2])
  end)

  it("loads torch's notebook MultiHeadAttention and reproduces its output within 2e-5", function()
    local m = nn.MultiHeadAttention(8, 12, 6, 0.0, 3)
    local res, meta = m:load(DIR .. "mha.safetensors")
    assert.are.same({ missing_keys = {}, unexpected_keys = {} }, res)
    assert.are.equal("3", meta.num_heads)
    assert.are.equal("123", meta.seed)
    m:eval()
    local y = m(attn.load(DIR .. "mha_input.npy"))
    assert.tensor_near(y, attn.load(DIR .. "mha_output.npy"), 2e-5)
  end)

  it("loads a torch module with qkv_bias and reproduces its output within 2e-5", function()
    local m = nn.MultiHeadAttention(5, 4, 4, 0.0, 2, { qkv_bias = true })
    m:load(DIR .. "mha_bias.safetensors")
    local y = m:eval()(attn.load(DIR .. "mha_bias_input.npy"))
    assert.tensor_near(y, attn.load(DIR .. "mha_bias_output.npy"), 2e-5)
  end)

  it("is not fooled: a module left at its own initialisation does not match torch's output", function()
    attn.manual_seed(1)
    local m = nn.MultiHeadAttention(8, 12, 6, 0.0, 3):eval()
    local y = m(attn.load(DIR .. "mha_input.npy"))
    assert.is_false(attn.allclose(y, attn.load(DIR .. "mha_output.npy"), 0, 2e-5))
  end)

  it("reads integer and bool tensors exactly (I64, I32, I16, I8, U8, BOOL, 0-dim, empty)", function()
    local d = attn.load_safetensors(DIR .. "ints.safetensors")
    local n = 0
    for name, fix in pairs(expected.ints) do
      assert.is_not_nil(d[name], "missing tensor " .. name)
      check_exact(d[name], fix.shape, fix.data)
      n = n + 1
    end
    local m = 0
    for _ in pairs(d) do m = m + 1 end
    assert.are.equal(n, m)
    -- hand-written values: the edges of each type and of float32's exact integers
    assert.are.same({ { 0, -1, 2 ^ 24 }, { -2 ^ 24, 7, 123456 } }, d.i64:totable())
    assert.are.same({ { -32768, 32767 } }, d.i16:totable())
    assert.are.same({ -128, 127, 0 }, d.i8:totable())
    assert.are.same({ { 0, 255 }, { 128, 1 } }, d.u8:totable())
    assert.are.same({ { 1, 0, 1 } }, d.mask:totable())
    assert.are.equal(12345, d.num_batches_tracked:item())
  end)

  it("reads a BOOL byte other than 0 and 1 as true (1)", function()
    local path = tmpname()
    write_bytes(path, st_bytes('{"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}', "\0\2\255"))
    assert.are.same({ 0, 1, 1 }, attn.load_safetensors(path).b:totable())
    os.remove(path)
  end)

  it("refuses an I64 value past 2^24, naming the path, the tensor, the element and the value", function()
    local path = DIR .. "bad_i64.safetensors"
    expect_error(function() attn.load_safetensors(path) end,
      "attn.load_safetensors: " .. path .. ": tensor 'steps' holds the I64 value 16777217 at element [2], "
        .. "which float32 cannot hold exactly (integers load only while |x| <= 2^24 = 16777216)")
  end)
end)

describe("Module:load errors", function()
  it("names a shape mismatch (a different context length gives a different mask)", function()
    local m = nn.MultiHeadAttention(8, 12, 5, 0.0, 3)
    local before = m.W_query.weight:clone()
    expect_error(function() m:load(DIR .. "mha.safetensors") end,
      "MultiHeadAttention:load: " .. DIR .. "mha.safetensors: ", 'size mismatch for "mask"',
      "shape [6, 6] from the state dict, the shape in the module is [5, 5]")
    assert.tensor_equal(m.W_query.weight, before) -- nothing copied
  end)

  it("names missing and unexpected keys when strict, and loads what fits when not", function()
    local m = nn.Module()
    m:add_module("W_query", nn.Linear(8, 12, { bias = false }))
    m:add_module("extra", nn.Linear(2, 2))
    expect_error(function() m:load(DIR .. "mha.safetensors") end,
      'missing key(s): "extra.weight", "extra.bias"', 'unexpected key(s): "W_key.weight"')
    local res = m:load(DIR .. "mha.safetensors", false)
    assert.are.same({ "extra.weight", "extra.bias" }, res.missing_keys)
    assert.are.same({ "W_key.weight", "W_value.weight", "mask", "out_proj.bias", "out_proj.weight" },
      res.unexpected_keys)
    local d = attn.load_safetensors(DIR .. "mha.safetensors")
    assert.tensor_equal(m.W_query.weight, d["W_query.weight"])
  end)

  it("checks its arguments", function()
    local m = nn.Linear(2, 2)
    expect_error(function() m:load(3) end, "Linear:load: bad argument #1 'path' (expected a string, got number)")
    expect_error(function() m:load("x", "yes") end, "Linear:load: bad argument #2 'strict' (expected boolean, got string)")
    expect_error(function() m:save({}) end, "Linear:save: bad argument #1 'path' (expected a string, got table)")
    expect_error(function() m:save("x", 1) end, "Linear:save: bad argument #2 'metadata'")
    expect_error(function() m:load("/nonexistent/w.safetensors") end,
      "Linear:load: /nonexistent/w.safetensors: cannot open the file: No such file or directory")
  end)
end)

describe("save then load", function()
  it("round-trips bit-identically: 0-dim, empty, non-contiguous views, special values, odd names", function()
    attn.manual_seed(42)
    local base = attn.randn(4, 5)
    local tensors = {
      plain = attn.randn(3, 4),
      scalar = attn.tensor(-0.0),
      empty = attn.zeros(0, 3),
      empty3 = attn.zeros(2, 0, 4),
      transposed = base:t(),                        -- strides (1, 5)
      narrowed = base:narrow(2, 2, 3),               -- a column range
      expanded = attn.tensor({ 1, 2, 3 }):expand(2, 3), -- stride 0
      special = attn.tensor({ math.huge, -math.huge, 0 / 0, -0.0, 1e-45, 3.4028235e38 }),
      ["layer.\u{540d}.weight"] = attn.rand(2),
      ['quote"back\\slash\nnewline'] = attn.rand(1),
      [""] = attn.rand(2, 2),
      five_d = attn.rand(2, 1, 3, 1, 2),
    }
    local path = tmpname()
    attn.save_safetensors(path, tensors, { format = "pt", ["k\"ey"] = "v\\al\u{e9}\0nul" })
    local d, meta = attn.load_safetensors(path)
    for name, t in pairs(tensors) do
      assert.is_not_nil(d[name], "missing " .. name)
      same_bits(d[name], t)
    end
    for name in pairs(d) do assert.is_not_nil(tensors[name], "unexpected " .. name) end
    assert.are.same({ format = "pt", ["k\"ey"] = "v\\al\u{e9}\0nul" }, meta)
    os.remove(path)
  end)

  it("writes exactly the reference layout (compact JSON, names sorted, padded to 8, LE float32)", function()
    local path = tmpname()
    local b = attn.tensor({ { 1, 2 }, { 3, 4 } })
    attn.save_safetensors(path, { b = b:t(), a = attn.tensor(0.5) }, { k = "v" })
    local header = '{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},'
      .. '"b":{"dtype":"F32","shape":[2,2],"data_offsets":[4,20]}}'
    header = header .. string.rep(" ", (8 - #header % 8) % 8)
    assert.are.equal(st_bytes(header, floats(0.5, 1, 3, 2, 4)), read_bytes(path))
    os.remove(path)
  end)

  it("writes no __metadata__ without metadata, and an empty dict as {}", function()
    local path = tmpname()
    attn.save_safetensors(path, {})
    assert.are.equal(st_bytes("{}      "), read_bytes(path))
    local d, meta = attn.load_safetensors(path)
    assert.are.same({}, d)
    assert.are.same({}, meta)
    os.remove(path)
  end)

  it("Module:save then Module:load into a fresh module gives the same weights and outputs", function()
    attn.manual_seed(3)
    local a = nn.MultiHeadAttention(6, 4, 5, 0.0, 2):eval()
    local path = tmpname()
    assert.are.equal(a, a:save(path, { num_heads = "2" }))
    attn.manual_seed(4)
    local b = nn.MultiHeadAttention(6, 4, 5, 0.0, 2):eval()
    local x = attn.rand(2, 5, 6)
    assert.is_false(attn.allclose(a(x), b(x)))
    local _, meta = b:load(path)
    assert.are.equal("2", meta.num_heads)
    for _, np in ipairs(a:named_parameters()) do
      same_bits(b:state_dict()[np[1]], np[2])
    end
    assert.tensor_equal(b(x), a(x))
    -- the file's names are the state_dict keys: parameters and the persistent mask
    local keys = {}
    for k in pairs(attn.load_safetensors(path)) do keys[#keys + 1] = k end
    table.sort(keys)
    local want = a:state_dict_keys()
    table.sort(want)
    assert.are.same(want, keys)
    os.remove(path)
  end)
end)

describe("attn.save_safetensors errors", function()
  local fn = "attn.save_safetensors: "
  it("checks its arguments", function()
    expect_error(function() attn.save_safetensors(1, {}) end, fn .. "bad argument #1 'path' (expected a string, got number)")
    expect_error(function() attn.save_safetensors("x", attn.rand(2)) end,
      fn .. "bad argument #2 'tensors' (expected a table name -> attn.Tensor, got attn.Tensor)")
    expect_error(function() attn.save_safetensors("x", { a = 1 }) end,
      fn .. "bad argument #2 'tensors': the value of 'a' is a number (expected attn.Tensor)")
    expect_error(function() attn.save_safetensors("x", { attn.rand(2) }) end,
      fn .. "bad argument #2 'tensors': keys must be tensor names (strings), got a number key")
    expect_error(function() attn.save_safetensors("x", { __metadata__ = attn.rand(2) }) end,
      "the name '__metadata__' is reserved")
    expect_error(function() attn.save_safetensors("x", {}, { k = 1 }) end,
      fn .. "bad argument #3 'metadata': entry 'k' is string -> number (expected string -> string)")
    expect_error(function() attn.save_safetensors("x", {}, 5) end, fn .. "bad argument #3 'metadata'")
  end)

  it("refuses names that are not UTF-8 (JSON strings must be) and leaves no file", function()
    local path = tmpname()
    expect_error(function() attn.save_safetensors(path, { ["bad\255"] = attn.rand(1) }) end,
      fn .. path .. ": the tensor name 'bad\255' is not valid UTF-8")
    assert.is_nil(io.open(path, "rb"))
  end)

  it("names an unwritable path", function()
    expect_error(function() attn.save_safetensors("/nonexistent/dir/w.safetensors", { a = attn.rand(1) }) end,
      fn .. "/nonexistent/dir/w.safetensors: cannot open the file for writing: No such file or directory")
  end)
end)

describe("attn.load_safetensors on malformed files", function()
  local fn = "attn.load_safetensors: "
  local good = '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
  local x = floats(1, 2)

  -- each case: the file's bytes and the pieces its error must hold
  local cases = {
    { "an empty file", "", "truncated: 0 bytes, too short for the 8-byte header length" },
    { "a file of 5 bytes", "\1\0\0\0\0", "truncated: 5 bytes" },
    { "an absurd header length", string.pack("<I8", 200000000) .. "{}",
      "its header length 200000000 is absurd (more than 100000000 bytes)" },
    { "a huge header length (2^63)", string.pack("<I8", math.mininteger) .. "{}", "is absurd" },
    { "a header longer than the file", string.pack("<I8", 100) .. good,
      "truncated: the header length is 100 bytes but the file holds only " .. #good .. " after it" },
    { "a JSON array", st_bytes("[]"), "bad JSON in the header at byte 0: the header is not a JSON object" },
    { "a missing ':'", st_bytes('{"x" {}}'), "bad JSON in the header at byte 5: expected ':', found '{'" },
    { "a trailing comma", st_bytes('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},}', x), "expected a string" },
    { "truncated JSON", st_bytes('{"x":{"dtype":'), "the header ends early (truncated JSON)" },
    { "an unterminated string", st_bytes('{"x'), "a string is not terminated" },
    { "an unknown escape", st_bytes('{"\\x":{}}'), "an unknown escape in a string" },
    { "a short \\u escape", st_bytes('{"\\u12":{}}'), "a \\u escape without 4 hex digits" },
    { "a lone low surrogate", st_bytes('{"\\udc00":{}}'), "a lone low surrogate" },
    { "a high surrogate alone", st_bytes('{"\\ud83dx":{}}'), "a high surrogate without its low surrogate" },
    { "a control character in a string", st_bytes('{"a\nb":{}}'), "a control character inside a string" },
    { "invalid UTF-8", st_bytes('{"\255":{}}'), "a string is not valid UTF-8" },
    { "a leading zero", st_bytes('{"x":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}', x), "a number with a leading zero" },
    { "a negative size", st_bytes('{"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', x), "a negative number" },
    { "a fractional size", st_bytes('{"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', x), "a number that is not an integer" },
    { "a string shape", st_bytes('{"x":{"dtype":"F32","shape":"2","data_offsets":[0,8]}}', x), "expected '['" },
    { "an overflowing integer", st_bytes('{"x":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}}', x),
      "an integer too large for 64 bits" },
    { "an unknown key", st_bytes('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"foo":1}}', x),
      "tensor 'x' has an unexpected or repeated key \"foo\"" },
    { "a repeated key", st_bytes('{"x":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', x),
      "unexpected or repeated key \"dtype\"" },
    { "a missing shape", st_bytes('{"x":{"dtype":"F32","data_offsets":[0,8]}}', x), "tensor 'x' has no \"shape\"" },
    { "three offsets", st_bytes('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', x), "more than 2 numbers" },
    { "one offset", st_bytes('{"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}}', x), "does not hold 2 numbers" },
    { "9 dims", st_bytes('{"x":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}', x), "more than 8 dims" },
    { "text after the object", st_bytes(good .. " x", x), "text after the JSON object" },
    { "a non-string metadata value", st_bytes('{"__metadata__":{"k":1}}'), "__metadata__ value of \"k\" is not a string" },
    { "__metadata__ twice", st_bytes('{"__metadata__":{},"__metadata__":{}}'), "__metadata__ appears twice" },
    { "dtype F16 spelled wrong", st_bytes('{"x":{"dtype":"F99","shape":[2],"data_offsets":[0,8]}}', x),
      "tensor 'x' has an unknown dtype \"F99\"" },
    { "dtype F8_E4M3", st_bytes('{"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}', "\0\0"),
      "tensor 'x' has dtype F8_E4M3 (expected F32; F64, F16, BF16, I64, I32, I16, I8, U8 and BOOL are converted" },
    { "data shorter than the header says", st_bytes(good, floats(1)),
      "truncated: tensor 'x' needs bytes [0, 8) of the data but the file holds 4 bytes of data" },
    { "a shape that does not match the offsets", st_bytes('{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', x),
      "tensor 'x' has shape [3] of F32 (12 bytes) but data_offsets [0, 8] span 8 bytes" },
    { "F64 offsets sized for F32", st_bytes('{"x":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}', x),
      "shape [2] of F64 (16 bytes)" },
    { "an end before the begin", st_bytes('{"x":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', x),
      "the end is before the begin" },
    { "overlapping offsets", st_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
      .. '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', floats(1, 2, 3)),
      "the data of tensors 'a' [0, 8) and 'b' [4, 12) overlap" },
    { "a gap between tensors", st_bytes('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
      .. '"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', floats(1, 2, 3)),
      "bytes [4, 8) of the data belong to no tensor (a gap before 'b')" },
    { "trailing data", st_bytes(good, floats(1, 2, 3)), "the tensors cover 8 bytes of data but the file holds 12" },
    { "a duplicate name", st_bytes('{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
      .. '"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', x), "the tensor name 'x' appears twice" },
    { "a duplicate metadata key", st_bytes('{"__metadata__":{"k":"a","k":"b"}}'), "the __metadata__ key \"k\" appears twice" },
    { "an I32 value past -2^24", st_bytes('{"x":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}',
      string.pack("<i4<i4<i4<i4", 0, 1, 2, -16777217)),
      "tensor 'x' holds the I32 value -16777217 at element [2, 2], which float32 cannot hold exactly" },
    { "the smallest I64", st_bytes('{"x":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', string.pack("<i8", math.mininteger)),
      "tensor 'x' holds the I64 value -9223372036854775808 at element [1]" },
    { "dtype U32", st_bytes('{"x":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}}', "\0\0\0\0"),
      "tensor 'x' has dtype U32 (expected F32; F64, F16, BF16, I64, I32, I16, I8, U8 and BOOL are converted, "
        .. "other dtypes are not supported)" },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[1], function()
      local path = tmpname()
      write_bytes(path, c[2])
      expect_error(function() attn.load_safetensors(path) end, fn .. path .. ": ", c[3])
      os.remove(path)
    end)
  end

  it("accepts what the format allows: whitespace, escapes, empty tensors anywhere, unpadded headers", function()
    local path = tmpname()
    write_bytes(path, st_bytes(' \t\n{ "e" : { "shape" : [ 0 ] , "data_offsets" : [ 0 , 0 ] , "dtype" : "F32" } ,\r\n'
      .. '"\\u0041\\n\\/" : {"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "__metadata__": {} }', floats(7)))
    local d, meta = attn.load_safetensors(path)
    assert.are.same({ 0 }, d.e:size())
    assert.are.equal(7, d["A\n/"][1])
    assert.are.same({}, meta)
    os.remove(path)
  end)

  it("names a missing file and a directory", function()
    expect_error(function() attn.load_safetensors("/nonexistent/w.safetensors") end,
      fn .. "/nonexistent/w.safetensors: cannot open the file: No such file or directory")
    expect_error(function() attn.load_safetensors("spec") end, fn .. "spec: cannot read it: not a regular file (a directory)")
    expect_error(function() attn.load_safetensors(nil) end, fn .. "bad argument #1 'path' (expected a string, got nil)")
  end)

  it("survives every truncation of a valid file with an error, never a crash", function()
    local whole = read_bytes(DIR .. "plain.safetensors")
    local path = tmpname()
    for len = 0, #whole - 1, 7 do
      write_bytes(path, whole:sub(1, len))
      local ok, err = pcall(attn.load_safetensors, path)
      assert.is_false(ok, "a file cut at " .. len .. " bytes loaded")
      assert.is_truthy(err:find(fn .. path .. ": ", 1, true), err)
    end
    os.remove(path)
  end)
end)

describe("safetensors through PyTorch", function()
  local has_torch = os.execute("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1")
  local function run(cmd)
    local p = io.popen(cmd .. " 2>&1")
    local out = p:read("a")
    return p:close(), out
  end
  local test = has_torch and it or pending

  test("torch runs weights attn saved and matches attn's output within 2e-5", function()
    attn.manual_seed(11)
    local m = nn.MultiHeadAttention(8, 12, 7, 0.0, 4, { qkv_bias = true }):eval()
    local w, xin, yout = tmpname(), tmpname(".npy"), tmpname(".npy")
    m:save(w, { num_heads = "4" })
    local x = attn.rand(3, 7, 8)
    attn.save(x, xin)
    local ok, out = run(("/usr/bin/python3 scripts/export_torch.py --run-mha %s %s %s"):format(w, xin, yout))
    assert.is_true(ok, out)
    assert.tensor_near(attn.load(yout), m(x), 2e-5)
    os.remove(w); os.remove(xin); os.remove(yout)
  end)

  test("export_torch.py turns a torch.save'd state_dict into weights attn loads", function()
    local pt, w, wn, bn = tmpname(".pt"), tmpname(), tmpname(".npy"), tmpname(".npy")
    local ok, out = run(("/usr/bin/python3 -c 'import torch, numpy as np; torch.manual_seed(5); "
      .. "m = torch.nn.Linear(3, 2); torch.save(m.state_dict(), \"%s\"); "
      .. "np.save(\"%s\", m.weight.detach().numpy()); np.save(\"%s\", m.bias.detach().numpy())'"):format(pt, wn, bn))
    assert.is_true(ok, out)
    ok, out = run(("/usr/bin/python3 scripts/export_torch.py %s %s"):format(pt, w))
    assert.is_true(ok, out)
    local m = nn.Linear(3, 2)
    local _, meta = m:load(w)
    assert.are.equal("pt", meta.format)
    assert.tensor_equal(m.weight, attn.load(wn))
    assert.tensor_equal(m.bias, attn.load(bn))
    os.remove(pt); os.remove(w); os.remove(wn); os.remove(bn)
  end)

  -- a whole model with integer, bool and complex buffers, saved by torch.save
  local function save_model(pt)
    return run(("/usr/bin/python3 -c 'import torch; torch.manual_seed(3); "
      .. "m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)); "
      .. "m[1].num_batches_tracked += 7; "
      .. "m.register_buffer(\"ids\", torch.arange(6).view(2, 3) - 2); "
      .. "m.register_buffer(\"keep\", torch.tensor([True, False, True])); "
      .. "m.register_buffer(\"small\", torch.tensor([-128, 127], dtype=torch.int8)); "
      .. "m.register_buffer(\"phase\", torch.tensor([1 + 2j])); "
      .. "torch.save(m, \"%s\")'"):format(pt))
  end

  test("export_torch.py converts a whole model's state dict, integer and bool buffers included", function()
    local pt, w = tmpname(".pt"), tmpname()
    local ok, out = save_model(pt)
    assert.is_true(ok, out)
    ok, out = run(("/usr/bin/python3 scripts/export_torch.py %s %s"):format(pt, w))
    assert.is_true(ok, out) -- the complex buffer does not refuse the model
    assert.is_truthy(out:find("tensor 'phase' (torch.complex64", 1, true), out)
    local d = attn.load_safetensors(w)
    assert.are.equal(7, d["1.num_batches_tracked"]:item())
    assert.are.same({ { -2, -1, 0 }, { 1, 2, 3 } }, d.ids:totable())
    assert.are.same({ 1, 0, 1 }, d.keep:totable())
    assert.are.same({ -128, 127 }, d.small:totable())
    assert.are.same({ 4, 3 }, d["0.weight"]:size())
    assert.is_nil(d.phase)
    os.remove(pt); os.remove(w)
  end)

  test("export_torch.py --skip-int leaves the integer and bool buffers out", function()
    local pt, w = tmpname(".pt"), tmpname()
    local ok, out = save_model(pt)
    assert.is_true(ok, out)
    ok, out = run(("/usr/bin/python3 scripts/export_torch.py --skip-int %s %s"):format(pt, w))
    assert.is_true(ok, out)
    local d = attn.load_safetensors(w)
    local names = {}
    for name in pairs(d) do names[#names + 1] = name end
    table.sort(names)
    assert.are.same({ "0.bias", "0.weight", "1.bias", "1.running_mean", "1.running_var", "1.weight" }, names)
    os.remove(pt); os.remove(w)
  end)

  test("export_torch.py warns about an integer past 2^24, which attn then refuses by name", function()
    local pt, w = tmpname(".pt"), tmpname()
    local ok, out = run(("/usr/bin/python3 -c 'import torch; "
      .. "torch.save({\"w\": torch.ones(2), \"step\": torch.tensor([5, 2 ** 30])}, \"%s\")'"):format(pt))
    assert.is_true(ok, out)
    ok, out = run(("/usr/bin/python3 scripts/export_torch.py %s %s"):format(pt, w))
    assert.is_true(ok, out)
    assert.is_truthy(out:find("integer tensor 'step' holds 1073741824, past 2^24", 1, true), out)
    expect_error(function() attn.load_safetensors(w) end,
      "tensor 'step' holds the I64 value 1073741824 at element [2]")
    os.remove(pt); os.remove(w)
  end)
end)
