-- attn.save / attn.load against .npy files written by NumPy
-- (scripts/fixtures/make_npy_fixtures.py wrote spec/fixtures/npy/*.npy and
-- the expected float32 values in spec/fixtures/npy_expected.lua).
local attn = require "attn"
require "attn.assert"

local expected = dofile("spec/fixtures/npy_expected.lua")
local DIR = "spec/fixtures/npy/"

local flat = dofile("spec/fixtures/tensor_check.lua").flat

-- bit-exact against the fixture: -0.0 keeps its sign, infinities match
local function check_exact(t, fix)
  assert.are.same(fix.shape, t:dim() == 0 and {} or t:size())
  local got = flat(t)
  assert.are.equal(#fix.data, #got)
  for i = 1, #got do
    assert.are.equal(fix.data[i], got[i])
    assert.are.equal(1 / fix.data[i] > 0, 1 / got[i] > 0) -- sign of zeros
  end
end

local function tmpname()
  local p = os.tmpname()
  os.remove(p)
  return p .. ".npy"
end

local function raw(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function expect_error(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  for _, piece in ipairs({ ... }) do
    assert.is_truthy(string.find(err, piece, 1, true), "expected '" .. piece .. "' in: " .. tostring(err))
  end
  return err
end

describe("attn.load", function()
  for _, name in ipairs({ "f4_2x3_v1", "f4_2x3_v2", "f4_2x3_v3", "f4_vec", "f4_scalar", "f4_empty", "f4_4d",
                          "f4_special", "f8_3x2", "f4_saved_from_view", "i8_2x3", "i4_vec", "i2_2x2", "i1_vec",
                          "u1_2x3", "b1_2x2", "f2_special", "i8_empty", "i4_scalar", "f4_fortran_3x4",
                          "f4_fortran_2x3x4", "i8_fortran_3x2", "f8_fortran_2x3" }) do
    it("reads NumPy's " .. name .. ".npy", function()
      check_exact(attn.load(DIR .. name .. ".npy"), expected[name])
    end)
  end

  it("converts float64 to float32 as NumPy's astype does (1/3 rounded, 1e39 -> inf, 1e-50 -> 0)", function()
    local t = attn.load(DIR .. "f8_3x2.npy")
    assert.are.equal(0x1.555556p-2, t[1][1])
    assert.are.equal(math.huge, t[2][1])
    assert.are.equal(-math.huge, t[2][2])
    assert.are.equal(0, t[3][1])
  end)

  it("reads integer and bool data exactly (hand-written values, 2^24 at the edge)", function()
    assert.are.same({ { 0, -1, 7 }, { 2 ^ 24, -2 ^ 24, 123456 } }, attn.load(DIR .. "i8_2x3.npy"):totable())
    assert.are.same({ 2 ^ 24 - 1, -5, 0, 2 ^ 24, -2 ^ 24 + 1 }, attn.load(DIR .. "i4_vec.npy"):totable())
    assert.are.same({ { -32768, 32767 }, { -1, 0 } }, attn.load(DIR .. "i2_2x2.npy"):totable())
    assert.are.same({ -128, 127, -1, 0, 5 }, attn.load(DIR .. "i1_vec.npy"):totable())
    assert.are.same({ { 0, 1, 255 }, { 128, 7, 200 } }, attn.load(DIR .. "u1_2x3.npy"):totable())
    assert.are.same({ { 1, 0 }, { 0, 1 } }, attn.load(DIR .. "b1_2x2.npy"):totable())
    assert.are.same({ 0, 2 }, attn.load(DIR .. "i8_empty.npy"):size())
    assert.are.equal(-42, attn.load(DIR .. "i4_scalar.npy"):item())
    local h = attn.load(DIR .. "f2_special.npy"):totable()
    assert.are.same({ 1, -2.5, 65504, -math.huge, math.huge }, { table.unpack(h, 1, 5) })
    assert.are.equal(2 ^ -24, h[7])              -- the smallest float16 subnormal
    assert.are.equal(0x1.998p-4, h[8])           -- float16's 0.1
  end)

  it("gives a contiguous tensor that owns its data", function()
    local t = attn.load(DIR .. "f4_2x3_v1.npy")
    assert.is_true(t:is_contiguous())
    assert.tensor_equal(t, { { -1, -0.5, 0 }, { 0.5, 1, 1.5 } }) -- hand-computed: arange(6) * 0.5 - 1
  end)

  it("reads a Fortran-order file (np.save of PyTorch's t.t().numpy()) into a C-order tensor of its values", function()
    local raw_bytes = raw(DIR .. "f4_fortran_3x4.npy")
    assert.is_truthy(raw_bytes:find("'fortran_order': True", 1, true)) -- NumPy wrote it in Fortran order
    local t = attn.load(DIR .. "f4_fortran_3x4.npy")
    assert.are.same({ 3, 4 }, t:size())
    assert.is_true(t:is_contiguous())
    -- the file's data is the [4, 3] array it was transposed from, in C order:
    -- element [i, j] of the result is the file's (j - 1) * 3 + i-th value
    local header_end = raw_bytes:find("\n", 1, true)
    for i = 1, 3 do
      for j = 1, 4 do
        local at = header_end + ((j - 1) * 3 + (i - 1)) * 4
        local v = string.unpack("<f", raw_bytes, at + 1)
        assert.are.equal(v, t[i][j], ("element [%d, %d]"):format(i, j))
      end
    end
    -- integers, converted while scattered (hand-written values)
    assert.are.same({ { 1, -2 }, { 3, 2 ^ 24 }, { -5, 6 } }, attn.load(DIR .. "i8_fortran_3x2.npy"):totable())
  end)

  it("saves what it loaded from a Fortran-order file in C order, as np.ascontiguousarray would", function()
    local path = tmpname()
    local t = attn.load(DIR .. "f4_fortran_2x3x4.npy")
    attn.save(t, path)
    local bytes = raw(path)
    assert.is_truthy(bytes:find("'fortran_order': False, 'shape': (2, 3, 4), }", 1, true))
    check_exact(attn.load(path), expected.f4_fortran_2x3x4)
    os.remove(path)
  end)

  local bad = {
    { "bad_fortran_int64_2p24plus1.npy", "element [1, 3] holds the int64 value 16777217, which float32 cannot hold "
      .. "exactly" },
    { "bad_uint32.npy", "dtype '<u4' is not supported (expected one of '<f4' '<f8' '<f2' '<i8' '<i4' '<i2' '|i1' '|u1' '|b1')" },
    { "bad_complex64.npy", "dtype '<c8' is not supported" },
    { "bad_bigendian_int.npy", "big-endian dtype '>i4' is not supported" },
    { "bad_int64_2p24plus1.npy", "element [2, 3] holds the int64 value 16777217, which float32 cannot hold exactly "
      .. "(integers load only while |x| <= 2^24 = 16777216)" },
    { "bad_int32_neg.npy", "element [2] holds the int32 value -16777217, which float32 cannot hold exactly" },
    { "bad_int64_min.npy", "element [1] holds the int64 value -9223372036854775808" },
    { "bad_bigendian.npy", "big-endian dtype '>f4' is not supported" },
    { "bad_structured.npy", "structured dtypes are not supported" },
    { "bad_9dims.npy", "more than 8 dims are not supported" },
    { "bad_truncated_header.npy", "is truncated: the header announces" },
    { "bad_truncated_preamble.npy", "is truncated: the file ends inside the .npy preamble" },
    { "bad_empty.npy", "is not a .npy file" },
    { "bad_truncated_data.npy", "is truncated: shape [3, 4] of '<f4' needs 48 bytes of data, the file holds 43" },
    { "bad_short_data.npy", "is truncated: shape [3, 4] of '<f4' needs 48 bytes of data, the file holds 32" },
    { "bad_magic.npy", "is not a .npy file (no \\x93NUMPY magic string)" },
    { "bad_version.npy", ".npy format version 9.0 is not supported" },
    { "bad_dict.npy", "'shape' is not a tuple" },
    { "bad_shape_text.npy", "'shape' holds something other than non-negative integers" },
    { "bad_no_shape.npy", "an unexpected or repeated key" },
    { "bad_huge_shape.npy", "shape [4294967296, 4294967296] has too many elements" },
    { "bad_header_len.npy", "is truncated: the header announces 65535 bytes" },
    { "bad_header_len_v2.npy", "header length 2147483647 is implausible" },
  }
  for _, case in ipairs(bad) do
    it("refuses " .. case[1] .. " with a clear error naming the file", function()
      local path = DIR .. case[1]
      assert.has_error(function() attn.load(path) end)
      expect_error(function() attn.load(path) end, "attn.load: ", "'" .. path .. "'", case[2])
    end)
  end

  it("refuses a missing file, a directory and a non-string path", function()
    expect_error(function() attn.load("spec/fixtures/npy/no_such_file.npy") end,
      "attn.load: cannot open 'spec/fixtures/npy/no_such_file.npy': No such file or directory")
    expect_error(function() attn.load("spec/fixtures/npy") end,
      "attn.load: cannot read 'spec/fixtures/npy': not a regular file")
    expect_error(function() attn.load(nil) end, "attn.load: bad argument #1 'path' (expected a string, got nil)")
    expect_error(function() attn.load(attn.zeros(2)) end, "attn.load: bad argument #1 'path' (expected a string, got userdata)")
  end)

  it("survives every truncation of a valid file (error, never a crash)", function()
    local whole = raw(DIR .. "f4_2x3_v2.npy")
    local path = tmpname()
    for len = 0, #whole - 1 do
      local f = assert(io.open(path, "wb")); f:write(whole:sub(1, len)); f:close()
      local ok, err = pcall(attn.load, path)
      assert.is_false(ok, "a file cut to " .. len .. " bytes loaded")
      assert.is_truthy(err:find(path, 1, true))
    end
    os.remove(path)
  end)

  it("survives single corrupted header bytes (error or a valid tensor, never a crash)", function()
    local whole = raw(DIR .. "f4_2x3_v1.npy")
    local path = tmpname()
    for pos = 1, 10 + 118 do
      for _, byte in ipairs({ 0, 0x20, 0x27, 0x28, 0x29, 0x2c, 0x39, 0x7d, 0xff }) do
        local s = whole:sub(1, pos - 1) .. string.char(byte) .. whole:sub(pos + 1)
        local f = assert(io.open(path, "wb")); f:write(s); f:close()
        local ok, res = pcall(attn.load, path)
        if ok then assert.is_true(attn.is_tensor(res)) else assert.is_truthy(res:find("attn.load: ", 1, true)) end
      end
    end
    os.remove(path)
  end)
end)

describe("attn.save", function()
  it("writes NumPy's own bytes for a [2, 3] float32 array (version 1.0 header, 64-byte aligned)", function()
    local path = tmpname()
    attn.save(attn.load(DIR .. "f4_2x3_v1.npy"), path)
    -- np.save wrote the fixture; the same array must come out byte for byte
    assert.are.equal(raw(DIR .. "f4_2x3_v1.npy"), raw(path))
    os.remove(path)
  end)

  it("writes 0-d, 1-d, empty and 4-d arrays as NumPy does", function()
    for _, name in ipairs({ "f4_scalar", "f4_vec", "f4_empty", "f4_4d" }) do
      local path = tmpname()
      attn.save(attn.load(DIR .. name .. ".npy"), path)
      assert.are.equal(raw(DIR .. name .. ".npy"), raw(path), name)
      os.remove(path)
    end
  end)

  it("round-trips views (transposed, narrowed, expanded) in C order", function()
    local base = attn.arange(12):view(3, 4)
    local views = {
      base:t(),                                   -- [4, 3]
      base:narrow(2, 2, 2),                       -- [3, 2]
      attn.tensor({ 1, 2, 3 }):view(3, 1):expand(3, 4),
      base:select(1, 2),
    }
    local want = {
      { { 0, 4, 8 }, { 1, 5, 9 }, { 2, 6, 10 }, { 3, 7, 11 } },
      { { 1, 2 }, { 5, 6 }, { 9, 10 } },
      { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 3, 3, 3, 3 } },
      { 4, 5, 6, 7 },
    }
    for i, v in ipairs(views) do
      local path = tmpname()
      attn.save(v, path)
      assert.tensor_equal(attn.load(path), want[i])
      os.remove(path)
    end
  end)

  it("round-trips special values bit-exactly", function()
    local path = tmpname()
    local t = attn.load(DIR .. "f4_special.npy")
    attn.save(t, path)
    check_exact(attn.load(path), expected.f4_special)
    os.remove(path)
  end)

  it("refuses bad arguments and unwritable paths", function()
    expect_error(function() attn.save({ 1, 2 }, "x.npy") end,
      "attn.save: bad argument #1 't' (expected attn.Tensor, got table)")
    expect_error(function() attn.save(attn.zeros(2)) end,
      "attn.save: bad argument #2 'path' (expected a string, got no value)")
    expect_error(function() attn.save(attn.zeros(2), "/nonexistent-dir/x.npy") end,
      "attn.save: cannot open '/nonexistent-dir/x.npy' for writing: No such file or directory")
  end)
end)

describe("attn.save/attn.load through NumPy", function()
  local has_numpy = os.execute("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1")
  local function py(code)
    local p = io.popen("/usr/bin/python3 -c '" .. code .. "' 2>&1")
    local out = p:read("a")
    local ok = p:close()
    return ok, out
  end

  local test = has_numpy and it or pending
  test("NumPy reads what attn saved, and attn reads what NumPy wrote from it", function()
    local src, dst = tmpname(), tmpname()
    local t = attn.load(DIR .. "f4_4d.npy"):permute(4, 2, 1, 3) -- [5, 3, 2, 4], not contiguous
    attn.save(t, src)
    -- NumPy checks the values against the original file and writes them back doubled as float64
    local ok, out = py(string.format(
      "import numpy as np; a = np.load(\"%s\"); r = np.load(\"%s\").transpose(3, 1, 0, 2); "
      .. "assert a.dtype == np.float32 and a.shape == (5, 3, 2, 4), (a.dtype, a.shape); "
      .. "assert (a == r).all(); np.save(\"%s\", a.astype(np.float64) * 2); print(\"ok\")",
      src, DIR .. "f4_4d.npy", dst))
    assert.is_true(ok, out)
    assert.are.equal("ok\n", out)
    assert.tensor_equal(attn.load(dst), t * 2)
    os.remove(src); os.remove(dst)
  end)
end)

describe("a failed write", function()
  it("is an error naming the cause, and never deletes a device it was written to", function()
    local p = io.popen("test -c /dev/full && echo yes")
    local has_full = p:read("a"):find("yes")
    p:close()
    if not has_full then return pending("no /dev/full here") end
    local ok, e = pcall(attn.save, attn.randn(3000):t(), "/dev/full")
    assert.is_false(ok)
    assert.truthy(e:find("attn.save: cannot write '/dev/full': No space left on device", 1, true), e)
    ok, e = pcall(attn.save_safetensors, "/dev/full", { a = attn.randn(3000) })
    assert.is_false(ok)
    assert.truthy(e:find("attn.save_safetensors: /dev/full: cannot write the file: No space left on device", 1, true), e)
    p = io.popen("test -c /dev/full && echo still")
    assert.truthy(p:read("a"):find("still"), "/dev/full was removed")
    p:close()
  end)
end)
