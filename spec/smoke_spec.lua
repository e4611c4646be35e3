local attn = require "attn"
describe("attn module", function()
  it("loads the C core and reports the BLAS core", function()
    local info = attn.blas_info()
    assert.is_string(info.core)
    assert.is_true(#info.core > 0)
  end)
end)
