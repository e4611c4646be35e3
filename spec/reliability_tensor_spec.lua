-- Reliability round 2 (issue #11), tensor items: in-place ops on overlapping
-- operands (7), writability of expanded views (8), x[{i, j}] indexing (15),
-- reductions over huge expanded views (18), argument checks of 17.
-- Expected values are computed here by hand or in plain Lua, never by attn.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")

local PARTIAL = "some elements of the input tensor and the written%-to tensor refer to a single memory location"
local SHARED = "more than one element of the written%-to tensor"

local function fails_matching(fn, fname, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  assert.truthy(err:find(fname, 1, true), "the error does not name " .. fname .. ": " .. err)
  assert.truthy(err:find(pattern), "the error does not match " .. pattern .. ": " .. err)
end

local function seq(n) return attn.arange(1, n + 1) end

describe("in-place ops with partially overlapping operands (issue #11 item 7)", function()
  for _, op in ipairs { "add_", "sub_", "mul_", "div_" } do
    it(op .. " of a view by a shifted view of the same storage is refused, self unchanged (as PyTorch)", function()
      local a = seq(6)
      fails_matching(function() a:narrow(1, 2, 5)[op](a:narrow(1, 2, 5), a:narrow(1, 1, 5)) end, "Tensor:" .. op,
        PARTIAL)
      C.is(a, { 6 }, { 1, 2, 3, 4, 5, 6 })
      fails_matching(function() a:narrow(1, 1, 5)[op](a:narrow(1, 1, 5), a:narrow(1, 2, 5)) end, "Tensor:" .. op,
        PARTIAL)
      C.is(a, { 6 }, { 1, 2, 3, 4, 5, 6 })
    end)
  end
  it("add_ on shifted rows, a transposed self and a broadcast row of self are refused", function()
    local a = seq(9):view(3, 3)
    fails_matching(function() a:narrow(1, 2, 2):add_(a:narrow(1, 1, 2)) end, "Tensor:add_", PARTIAL)
    fails_matching(function() a:add_(a:t()) end, "Tensor:add_", PARTIAL)
    fails_matching(function() a:add_(a[1]) end, "Tensor:add_", PARTIAL)
    C.is(a, { 3, 3 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9 })
  end)
  it("exact full overlap (a:add_(a)) and disjoint views of one storage still work", function()
    local a = seq(6)
    a:add_(a)
    C.is(a, { 6 }, { 2, 4, 6, 8, 10, 12 })
    a:mul_(a:view(2, 3):view(6))
    C.is(a, { 6 }, { 4, 16, 36, 64, 100, 144 })
    local b = seq(6)
    b:narrow(1, 4, 3):add_(b:narrow(1, 1, 3)) -- no element in common
    C.is(b, { 6 }, { 1, 2, 3, 5, 7, 9 })
    -- interleaved columns: the address ranges meet, the elements do not
    local c = seq(12):view(3, 2, 2)
    c:select(3, 1):add_(c:select(3, 2))
    C.is(c:view(-1), { 12 }, { 3, 2, 7, 4, 11, 6, 15, 8, 19, 10, 23, 12 })
    -- one element of self broadcast into the others
    local d = seq(4)
    d:narrow(1, 2, 3):add_(d:narrow(1, 1, 1))
    C.is(d, { 4 }, { 1, 3, 4, 5 })
  end)
  it("masked_fill_ with a mask that is a shifted view of self is refused; mask == self works", function()
    local a = attn.tensor { 0, 1, 0, 1, 1, 0 }
    fails_matching(function() a:narrow(1, 2, 5):masked_fill_(a:narrow(1, 1, 5), 9) end, "Tensor:masked_fill_", PARTIAL)
    C.is(a, { 6 }, { 0, 1, 0, 1, 1, 0 })
    a:masked_fill_(a, 7)
    C.is(a, { 6 }, { 0, 7, 0, 7, 7, 0 })
  end)
  it("copy_ and t[i] = view compute as if the source were copied first", function()
    local a = seq(6)
    a:narrow(1, 2, 5):copy_(a:narrow(1, 1, 5)) -- different data pointers, overlapping
    C.is(a, { 6 }, { 1, 1, 2, 3, 4, 5 })
    local b = seq(6)
    b:narrow(1, 1, 5):copy_(b:narrow(1, 2, 5))
    C.is(b, { 6 }, { 2, 3, 4, 5, 6, 6 })
    local g = seq(9):view(3, 3)
    g[2] = g:view(-1):narrow(1, 2, 3) -- row 2 := elements 2..4 (4 is row 2's first)
    C.is(g, { 3, 3 }, { 1, 2, 3, 2, 3, 4, 7, 8, 9 })
    local s = seq(4):view(2, 2)
    s:copy_(s) -- onto itself
    C.is(s, { 2, 2 }, { 1, 2, 3, 4 })
  end)
end)

describe("in-place ops on an expanded (self-overlapping) view (issue #11 item 8)", function()
  local function column() return attn.ones(3):view(3, 1):expand(3, 3) end
  local refused = {
    { "triu_", function(e) return e:triu_(1) end },
    { "tril_", function(e) return e:tril_() end },
    { "masked_fill_", function(e) return e:masked_fill_(attn.eye(3), 0) end },
    { "add_", function(e) return e:add_(1) end },
    { "mul_", function(e) return e:mul_(attn.ones(3, 3)) end },
    { "copy_", function(e) return e:copy_(attn.zeros(3, 3)) end },
    { "uniform_", function(e) return e:uniform_() end },
    { "normal_", function(e) return e:normal_() end },
  }
  for _, case in ipairs(refused) do
    it(case[1] .. " is refused with the one wording, and leaves the storage alone", function()
      local base = attn.ones(3)
      local e = base:view(3, 1):expand(3, 3)
      fails_matching(function() case[2](e) end, "Tensor:" .. case[1], SHARED)
      fails_matching(function() case[2](e) end, "Tensor:" .. case[1], "Please clone%(%) the tensor")
      C.is(base, { 3 }, { 1, 1, 1 })
    end)
  end
  it("t[i] = tensor into an expanded row is refused with the same wording", function()
    fails_matching(function() local e = column(); e[1] = attn.zeros(3) end, "attn.Tensor index assignment", SHARED)
  end)
  it("fills write one value everywhere and stay allowed, as in PyTorch: fill_, zero_, t[i] = number", function()
    local base = attn.ones(3)
    base:view(3, 1):expand(3, 3):fill_(2)
    C.is(base, { 3 }, { 2, 2, 2 })
    base:view(3, 1):expand(3, 3):zero_()
    C.is(base, { 3 }, { 0, 0, 0 })
    local e = base:view(3, 1):expand(3, 3)
    e[2] = 5
    C.is(base, { 3 }, { 0, 5, 0 })
  end)

end)
