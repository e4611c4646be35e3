-- m:load(path) given a file it cannot load says what the file is and how to
-- load it: a PyTorch torch.save file (zip archive or legacy pickle, made by
-- scripts/fixtures/make_torch_save_fixtures.py) names scripts/export_torch.py;
-- a training checkpoint (attn.checkpoint.save) names attn.checkpoint.load.
-- The module is left as it was.
local attn = require "attn"
local checkpoint = require "attn.checkpoint"
local nn = attn.nn
require "attn.assert"

local DIR = "spec/fixtures/torch_save/"

local function err_of(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error")
  return tostring(err)
end

local function tmpname(ext)
  local p = os.tmpname()
  os.remove(p)
  return p .. ext
end

describe("m:load on a file that holds no module weights", function()
  for _, c in ipairs({ { "linear_zip.pt", "zip" }, { "linear_legacy.pt", "legacy" } }) do
    it("says that " .. c[1] .. " (torch.save, " .. c[2] .. " format) is a PyTorch pickle and names "
       .. "scripts/export_torch.py", function()
      local m = nn.Linear(2, 3)
      local before = m.weight:clone()
      for _, strict in ipairs({ true, false }) do
        local err = err_of(function() m:load(DIR .. c[1], strict) end)
        assert.truthy(err:find("Linear:load: " .. DIR .. c[1] .. " is a PyTorch pickle (torch.save's " .. c[2]
          .. " format), not a safetensors file", 1, true), err)
        assert.truthy(err:find("scripts/export_torch.py " .. DIR .. c[1] .. " out.safetensors", 1, true), err)
      end
      assert.tensor_equal(m.weight, before)
    end)
  end

  it("says that a training checkpoint is one and names attn.checkpoint.load", function()
    local m = nn.Linear(2, 3)
    local path = tmpname(".safetensors")
    checkpoint.save(path, m, attn.optim.SGD(m:parameters(), { lr = 0.1 }), { step = 3 })
    local other = nn.Linear(2, 3)
    local before = other.weight:clone()
    for _, strict in ipairs({ true, false }) do
      local err = err_of(function() other:load(path, strict) end)
      assert.truthy(err:find("Linear:load: " .. path .. " is a training checkpoint (written by attn.checkpoint.save)",
        1, true), err)
      assert.truthy(err:find('require("attn.checkpoint").load(path, model[, optimizer])', 1, true), err)
    end
    assert.tensor_equal(other.weight, before)
    -- the way the message names loads it
    checkpoint.load(path, other, attn.optim.SGD(other:parameters(), { lr = 0.1 }))
    assert.tensor_equal(other.weight, m.weight)
    os.remove(path)
  end)

  it("keeps the safetensors reader's message for any other file that is not safetensors", function()
    local path = tmpname(".bin")
    local f = assert(io.open(path, "wb"))
    f:write("PK\5\6 not torch, not safetensors")
    f:close()
    local err = err_of(function() nn.Linear(2, 3):load(path) end)
    assert.is_nil(err:find("PyTorch", 1, true), err)
    assert.truthy(err:find("Linear:load: " .. path, 1, true), err)
    os.remove(path)
  end)

  it("still loads weights saved by m:save", function()
    local m, path = nn.Linear(2, 3), tmpname(".safetensors")
    m:save(path)
    local other = nn.Linear(2, 3)
    other:load(path)
    assert.tensor_equal(other.weight, m.weight)
    os.remove(path)
  end)
end)
