--- Helpers the bit-exact specs share (RNG streams, dropout masks, module
-- initialisation against PyTorch): float32 bit patterns, flattening a tensor,
-- and error-message matching. `require "support.bits"` (spec/ is on busted's
-- path through .busted).
local assert = require "luassert"

local M = {}

--- The float32 bit pattern of a number, as an integer.
function M.f32bits(x)
  return (string.unpack("<I4", string.pack("<f", x)))
end

--- x rounded to float32.
function M.fl(x)
  return (string.unpack("<f", string.pack("<f", x)))
end

--- The elements of a tensor in row-major order, as a flat list.
function M.flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then
      for _, e in ipairs(v) do walk(e) end
    else
      out[#out + 1] = v
    end
  end
  walk(t:totable())
  return out
end

--- "0x%08x" bit patterns of a list of numbers (comparable with are.same).
function M.hex_list(values)
  local out = {}
  for i, v in ipairs(values) do out[i] = string.format("0x%08x", M.f32bits(v)) end
  return out
end

--- A tensor (or a list of numbers) against a list of float32 bit patterns;
-- the first differing element is named with both patterns.
function M.assert_bits(got, want, what)
  local vals = type(got) == "table" and got or M.flat(got)
  assert.are.equal(#want, #vals, what .. ": element count")
  for i = 1, #want do
    local b = M.f32bits(vals[i])
    if b ~= want[i] then
      error(string.format("%s: element %d is 0x%08x (%.9g), expected 0x%08x", what, i, b, vals[i], want[i]), 2)
    end
  end
end

--- fn() must raise an error whose message contains text (plain match).
function M.error_matching(fn, text)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error containing: " .. text)
  err = tostring(err)
  assert.is_truthy(err:find(text, 1, true), "error '" .. err .. "' does not contain '" .. text .. "'")
end

return M
