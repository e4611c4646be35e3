-- The autograd helpers of the core module (src/binding/lua_autograd.c, on the
-- backward's hot path: attn.core._autograd_ones_like, _autograd_shape_key,
-- _autograd_fill_key, _autograd_same_size): every wrong argument (nil, a
-- number, a table, a string, a userdata that is not a tensor, a string that is
-- no shape key) is a Lua error naming the function, the argument, what was
-- expected and what came; never a crash, never a silent answer. And what
-- they give for right arguments.
local attn = require "attn"
local core = require "attn.core"

local t = attn.ones(2, 3)
local one = attn.tensor({ 4.5 })
local key = core._autograd_shape_key(t)
local FILE = io.stdout -- a full userdata of another kind (its own metatable)

-- fn(...) raises an error naming fn and each piece of `want` (plain text)
local function fails(fname, args, want)
  local ok, err = pcall(core[fname], table.unpack(args, 1, args.n or #args))
  assert.is_false(ok, fname .. " accepted a bad argument")
  err = tostring(err)
  assert.is_truthy(err:find("attn.core." .. fname .. ": ", 1, true), "the function is not named: " .. err)
  for _, piece in ipairs(want) do
    assert.is_truthy(err:find(piece, 1, true), ("%q not in %q"):format(piece, err))
  end
end

describe("autograd helpers: bad arguments are errors naming the function and argument", function()
  it("_autograd_ones_like(t): t not a tensor", function()
    for _, c in ipairs { { nil, "nil" }, { 1, "number" }, { {}, "table" }, { "s", "string" }, { FILE, "userdata" },
                         { true, "boolean" } } do
      fails("_autograd_ones_like", { c[1], n = 1 },
        { "bad argument #1 't'", "expected attn.Tensor", "got " .. c[2] })
    end
  end)

  it("_autograd_shape_key(t): t not a tensor", function()
    for _, c in ipairs { { nil, "nil" }, { 7, "number" }, { { t }, "table" }, { FILE, "userdata" } } do
      fails("_autograd_shape_key", { c[1], n = 1 },
        { "bad argument #1 't'", "expected attn.Tensor", "got " .. c[2] })
    end
  end)

  it("_autograd_fill_key(key, g): key not a shape key", function()
    for _, c in ipairs { { nil, "nil" }, { 8, "number" }, { {}, "table" }, { FILE, "userdata" }, { t, "userdata" } } do
      fails("_autograd_fill_key", { c[1], one, n = 2 },
        { "bad argument #1 'key'", "expected a shape key", "got " .. c[2] })
    end
    -- strings of a length no key has: not a multiple of 8 bytes, or more than 8 sizes
    fails("_autograd_fill_key", { "abc", one }, { "bad argument #1 'key'", "got a string of 3 bytes" })
    fails("_autograd_fill_key", { ("x"):rep(72), one }, { "bad argument #1 'key'", "got a string of 72 bytes" })
  end)

  it("_autograd_fill_key(key, g): g not a one-element tensor", function()
    for _, c in ipairs { { nil, "nil" }, { 1, "number" }, { {}, "table" }, { FILE, "userdata" }, { key, "string" } } do
      fails("_autograd_fill_key", { key, c[1], n = 2 },
        { "bad argument #2 'g'", "expected attn.Tensor", "got " .. c[2] })
    end
    fails("_autograd_fill_key", { key, t }, { "bad argument #2 'g'", "expected one element, got 6" })
  end)

  it("_autograd_same_size(g, shape): g not a tensor", function()
    for _, c in ipairs { { nil, "nil" }, { 2, "number" }, { {}, "table" }, { FILE, "userdata" }, { key, "string" } } do
      fails("_autograd_same_size", { c[1], t, n = 2 },
        { "bad argument #1 'g'", "expected attn.Tensor", "got " .. c[2] })
    end
  end)

  it("_autograd_same_size(g, shape): shape neither a tensor, a list of sizes nor a shape key", function()
    for _, c in ipairs { { nil, "nil" }, { 2, "number" }, { FILE, "userdata" }, { false, "boolean" } } do
      fails("_autograd_same_size", { t, c[1], n = 2 },
        { "bad argument #2 'shape'", "expected attn.Tensor, a list of sizes or a shape key", "got " .. c[2] })
    end
    fails("_autograd_same_size", { t, "abcdefghi" }, { "bad argument #2 'shape'", "got a string of 9 bytes" })
    fails("_autograd_same_size", { t, { 2, 1.5 } },
      { "bad argument #2 'shape'", "expected a list of integer sizes", "got a non-integer number at 2" })
    fails("_autograd_same_size", { t, { "2", 3 } },
      { "bad argument #2 'shape'", "expected a list of integer sizes", "got string at 1" })
    fails("_autograd_same_size", { t, { 2, 3, t } }, { "bad argument #2 'shape'", "got userdata at 3" })
  end)
end)

describe("autograd helpers: right arguments", function()
  it("_autograd_ones_like gives ones of t's sizes", function()
    local o = core._autograd_ones_like(attn.zeros(3, 1, 2))
    assert.same({ 3, 1, 2 }, o:size())
    assert.same({ { { 1, 1 } }, { { 1, 1 } }, { { 1, 1 } } }, o:totable())
  end)

  it("_autograd_fill_key fills the key's sizes with g's value; _autograd_same_size compares", function()
    local f = core._autograd_fill_key(key, one)
    assert.same({ { 4.5, 4.5, 4.5 }, { 4.5, 4.5, 4.5 } }, f:totable())
    local scalar_key = core._autograd_shape_key(attn.tensor(3))
    assert.same({}, core._autograd_fill_key(scalar_key, one):size())
    assert.is_true(core._autograd_same_size(t, key))
    assert.is_true(core._autograd_same_size(t, attn.zeros(2, 3)))
    assert.is_true(core._autograd_same_size(t, { 2, 3 }))
    assert.is_false(core._autograd_same_size(t, { 3, 2 }))
    assert.is_false(core._autograd_same_size(t, { 2, 3, 1 }))
    assert.is_false(core._autograd_same_size(t, scalar_key))
    assert.is_false(core._autograd_same_size(t, attn.zeros(6)))
  end)
end)
