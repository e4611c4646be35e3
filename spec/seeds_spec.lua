-- The notebook ports print every tensor the reference notebooks printed that
-- their code determines (scripts/examples/check_seeds.lua against spec/fixtures/seeds_expected.lua).
local check = dofile("scripts/examples/check_seeds.lua")

describe("scripts/examples/check_seeds.lua parsing", function()
  it("finds printed tensors but not torch.tensor( code", function()
    local found = check.printed_tensors("x = torch.tensor([1.])\nprint: tensor([0.5000, 1.0000])\n")
    assert.are.equal(1, #found)
    assert.are.equal("tensor([0.5000, 1.0000])", found[1].text)
  end)

  it("reads shape and values, ignoring grad_fn", function()
    local values, shape = check.parse { text = "tensor([[1.0000, -inf],\n        [2.5000, 3.0000]], grad_fn=<MmBackward0>)" }
    assert.are.same({ 2, 2 }, shape)
    assert.are.equal(4, #values)
    assert.are.equal(-math.huge, values[2].value)
    assert.are.equal(2.5, values[3].value)
  end)

  it("agrees within one unit of the 4th decimal and not beyond", function()
    local want = { text = "tensor([0.1234, 1.5000e-03])" }
    assert.is_true(check.agree(want, { text = "tensor([0.1235, 1.5001e-03])" }))
    assert.is_false(check.agree(want, { text = "tensor([0.1237, 1.5000e-03])" }))
    assert.is_false(check.agree(want, { text = "tensor([0.1234, 1.5003e-03])" }))
    assert.is_false(check.agree(want, { text = "tensor([[0.1234, 1.5000e-03]])" }))
  end)
end)

describe("notebook ports", function()
  local expected = dofile("spec/fixtures/seeds_expected.lua")
  for _, nb in ipairs(expected) do
    it("scripts/examples/seeds/" .. nb.notebook .. "_*.lua prints the notebook's tensors", function()
      local cmd = string.format("scripts/attn-lua scripts/examples/check_seeds.lua %s 2>&1", nb.notebook)
      local p = io.popen(cmd)
      local out = p:read("a")
      local ok = p:close()
      assert(ok, out)
      assert.matches("%d+/%d+ printed tensors matched", out)
      local matched, total = out:match("(%d+)/(%d+) printed tensors matched")
      assert.are.equal(total, matched, out)
    end)
  end
end)
