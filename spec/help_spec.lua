-- attn.help: every public name has a doc, read from the LDoc comments.
local attn = require "attn"
local help = require "attn.tools.help"

local function quietly(fn, ...)
  local saved = _G.print
  local printed = {}
  _G.print = function(...) printed[#printed + 1] = table.concat({ ... }, "\t") end
  local res = table.pack(pcall(fn, ...))
  _G.print = saved
  assert(res[1], res[2])
  -- attn.help prints and returns nothing (so the REPL shows the text once)
  assert.are.equal(1, res.n)
  return table.concat(printed, "\n")
end

local function err_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "no error")
  return tostring(err)
end

-- the class files in lua/attn/nn/ (capitalised names), listed here
-- independently of attn.help's own listing
local function class_files()
  local names = {}
  local p = assert(io.popen("ls lua/attn/nn"))
  for f in p:lines() do
    local name = f:match("^(%u[%w_]*)%.lua$")
    if name then names[#names + 1] = name end
  end
  p:close()
  assert.is_true(#names >= 9)
  return names
end

describe("every public name has a doc", function()
  local function undocumented(prefix, t, want_type)
    local missing = {}
    for name, v in pairs(t) do
      if type(name) == "string" and not name:match("^_") and (want_type == nil or type(v) == want_type) then
        local ok = pcall(help.text, prefix .. name)
        if not ok then missing[#missing + 1] = prefix .. name end
      end
    end
    table.sort(missing)
    return table.concat(missing, ", ")
  end

  it("every attn function and table", function()
    assert.are.equal("", undocumented("", attn))
  end)

  it("every tensor method", function()
    assert.are.equal("", undocumented("Tensor.", attn.Tensor))
  end)

  it("every attn.viz function", function()
    assert.are.equal("", undocumented("viz.", attn.viz, "function"))
  end)

  it("every nn class (one per lua/attn/nn/NAME.lua) and nn.ModuleList", function()
    local missing = {}
    for _, name in ipairs(class_files()) do
      assert.is_table(attn.nn[name], name)
      if not pcall(help.text, "nn." .. name) then missing[#missing + 1] = name end
    end
    assert.are.equal("", table.concat(missing, ", "))
    assert.are.equal("", undocumented("nn.", attn.nn))
  end)
end)

describe("attn.help", function()
  it("prints the doc of a C function by value and by name, from lua/attn/tools/ldoc_core.lua", function()
    local text = quietly(attn.help, attn.matmul)
    assert.are.equal(text, help.text(attn.matmul))
    assert.are.equal(text, (quietly(attn.help, "matmul")))
    assert.are.equal(text, (quietly(attn.help, "attn.matmul")))
    assert.is_truthy(text:find("^attn%.matmul\nThe matrix product with torch%.matmul's rules"), text)
    local f = assert(io.open("lua/attn/tools/ldoc_core.lua"))
    local src = f:read("a")
    f:close()
    assert.is_truthy(src:find("--- The matrix product with torch.matmul's rules", 1, true))
  end)

  it("prints a class's doc from its @classmod comment", function()
    local text = quietly(attn.help, attn.nn.MultiHeadAttention)
    assert.is_truthy(text:find("^attn%.nn%.MultiHeadAttention\nattn%.nn%.MultiHeadAttention%(d_in, d_out"), text)
    assert.are.equal(quietly(attn.help, "nn.Linear"), quietly(attn.help, attn.nn.Linear))
  end)

  it("documents a Lua function from the comment above its definition, with its parameters", function()
    local text = quietly(attn.help, attn.allclose)
    assert.are.equal("attn.allclose\n`|a - b| <= atol + rtol * |b|` everywhere (broadcasting), NaN never close.\n"
      .. "  a tensor\n  b tensor\n  rtol (optional, default 1e-5)\n  atol (optional, default 1e-8)", text)
  end)

  it("finds tensor methods as Tensor.name, Tensor:name and t:name; shared ones under attn", function()
    local view = quietly(attn.help, "Tensor.view")
    assert.is_truthy(view:find("^attn%.Tensor%.view\nA view with a new shape"), view)
    assert.are.equal(view, (quietly(attn.help, "t:view")))
    assert.are.equal(view, (quietly(attn.help, attn.Tensor.view)))
    assert.are.equal(quietly(attn.help, "add"), quietly(attn.help, "Tensor:add"))
  end)

  it("lists the topics when called without an argument", function()
    local text = quietly(attn.help)
    for _, piece in ipairs({ "attn functions:", " matmul ", "tensor methods", " view ", "nn classes:",
                             " MultiHeadAttention ", "attn.viz:", " heatmap " }) do
      assert.is_truthy(text:find(piece, 1, true), piece)
    end
  end)

  it("suggests close names for an unknown one (help.text raises them)", function()
    assert.are.equal("attn.help: no doc for 'matmull'; did you mean matmul, mul?", err_of(help.text, "matmull"))
    assert.are.equal("attn.help: no doc for 'nn.Lnear'; did you mean nn.Linear?", err_of(help.text, "nn.Lnear"))
    assert.are.equal("attn.help: no doc for 'qqqqqqq'; attn.help() lists the topics", err_of(help.text, "qqqqqqq"))
  end)

  it("prints the suggestions for an unknown name instead of raising", function()
    assert.are.equal("attn.help: no doc for 'matmull'; did you mean matmul, mul?", quietly(attn.help, "matmull"))
    assert.are.equal("attn.help: no doc for 'qqqqqqq'; attn.help() lists the topics", quietly(attn.help, "qqqqqqq"))
    assert.are.equal("attn.help: no doc for 'Tensor.transpos'; did you mean Tensor.transpose?",
      quietly(attn.help, "Tensor.transpos"))
  end)

  it("finds a tensor method by its short name: help(\"transpose\") is Tensor:transpose", function()
    local text = quietly(attn.help, "transpose")
    assert.are.equal(quietly(attn.help, "Tensor.transpose"), text)
    assert.is_truthy(text:find("^attn%.Tensor%.transpose\nA view with dims d1 and d2 swapped"), text)
    -- a name that is both a function and a method stays the function
    assert.is_truthy(quietly(attn.help, "matmul"):find("^attn%.matmul\n"))
  end)

  it("given a tensor, lists the documented tensor methods", function()
    local text = quietly(attn.help, attn.zeros(2, 3))
    assert.is_truthy(text:find("^attn%.Tensor of shape %[2, 3%]: its methods"), text)
    for _, name in ipairs { "transpose", "view", "softmax", "masked_fill", "add" } do
      assert.is_truthy(text:find("%f[%w_]" .. name .. "%f[^%w_]"), name)
    end
    assert.is_falsy(text:find("__index", 1, true))
  end)

  it("given a class or a module, shows the constructor's doc and the methods", function()
    local text = quietly(attn.help, attn.nn.Linear)
    assert.is_truthy(text:find("^attn%.nn%.Linear\nattn%.nn%.Linear%(in_features, out_features"), text)
    assert.is_truthy(text:find("\nmethods:\n  m:extra_repr  Extra text inside the parentheses of tostring"
      .. " (like torch's extra_repr); \"\" by default.\n  m:forward  x [..., in_features] -> [..., out_features].\n",
      1, true), text)
    assert.is_truthy(text:find("\nmethods from Module:\n", 1, true), text)
    assert.is_truthy(text:find("\n  m:state_dict_keys  The keys of state_dict(), in PyTorch's order.", 1, true), text)
    assert.are.equal(text, quietly(attn.help, attn.nn.Linear(2, 3)))
    local mha = quietly(attn.help, "nn.MultiheadAttention")
    assert.is_truthy(mha:find("^attn%.nn%.MultiheadAttention\nattn%.nn%.MultiheadAttention%(embed_dim, num_heads"), mha)
    assert.is_truthy(mha:find("\n  m:forward  The attention.", 1, true), mha)
    assert.are.equal(mha, quietly(attn.help, "nn.TorchMultiheadAttention"))
  end)

  it("refuses values that are not public attn functions or classes", function()
    assert.is_truthy(err_of(attn.help, print):find(
      "attn.help: bad argument #1 (expected a public attn function or class, or its name; got a function", 1, true))
    assert.is_truthy(err_of(attn.help, 42):find("got number)", 1, true))
  end)
end)

describe("attn.help.parse", function()
  it("reads module, @function and definition blocks as LDoc does", function()
    local docs = help.parse(table.concat({
      "--- The module.",
      "-- @module demo",
      "local demo = {}",
      "--- Adds.",
      "-- @param a first",
      "-- @param[opt=2] b second",
      "-- @return the sum",
      "function demo.add(a, b) end",
      "-- not a doc comment",
      "function demo.hidden() end",
      "--- From C.",
      "-- @function Tensor:view",
      "--- A field.",
      "demo.x = 1",
      "---- a ruler, not a doc",
    }, "\n"))
    assert.are.same({
      { name = "demo", text = "The module." },
      { name = "demo.add", text = "Adds.\n  a first\n  b (optional, default 2) second\n  returns the sum" },
      { name = "demo.Tensor.view", text = "From C." },
      { name = "demo.x", text = "A field." },
    }, docs)
  end)

  it("names a function of the local table a file returns after its module", function()
    local docs = help.parse("--- Grads.\n-- @module attn.autograd\nlocal M = {}\n--- The gradients.\n"
      .. "function M.grad(o, i) end\nreturn M\n")
    assert.are.same({ { name = "attn.autograd", text = "Grads." }, { name = "attn.autograd.grad", text = "The gradients." } },
      docs)
  end)
end)

describe("attn.help's index", function()
  -- the areas, found here independently of attn.help: attn's table fields and
  -- the lower-case modules under lua/attn/ and lua/attn/nn/
  local function lower_modules(dir)
    local names = {}
    local p = assert(io.popen("ls " .. dir))
    for f in p:lines() do
      local name = f:match("^(%l[%w_]*)%.lua$")
      if not name and f:match("^%l[%w_]*$") then
        local fh = io.open(dir .. "/" .. f .. "/init.lua")
        if fh then fh:close(); name = f end
      end
      if name and name ~= "init" then names[#names + 1] = name end
    end
    p:close()
    return names
  end

  it("lists every public area under a heading of its own", function()
    local text = quietly(attn.help)
    for _, area in ipairs { "attn.block_mask:", "attn.optim:", "attn.autograd:", "attn.nn.functional:",
                            "attn.nn.utils:", "attn.viz:", "attn.checkpoint (require \"attn.checkpoint\"):",
                            "attn.assert (require \"attn.assert\"):" } do
      assert.is_truthy(text:find("\n" .. area .. "\n", 1, true), area)
    end
    for k, v in pairs(attn) do
      if type(v) == "table" and k ~= "Tensor" and k ~= "nn" then
        assert.is_truthy(text:find("\nattn." .. k .. ":\n", 1, true), k)
      end
    end
    -- modules that are attn's plumbing, not areas
    local internal = { core = true, sdpa_autograd = true, checks = true }
    for _, m in ipairs(lower_modules("lua/attn")) do
      if not internal[m] and rawget(attn, m) == nil then
        assert.is_truthy(text:find("\nattn." .. m .. " (require \"attn." .. m .. "\"):\n", 1, true), m)
      end
    end
    for _, m in ipairs(lower_modules("lua/attn/nn")) do
      if not internal[m] then assert.is_truthy(text:find("\nattn.nn." .. m .. ":\n", 1, true), m) end
    end
    assert.is_falsy(text:find("sdpa_autograd", 1, true))
    assert.is_falsy(text:find("mark_parameter", 1, true)) -- autograd's helper for the nn classes
  end)

  it("lists an area's names, and each has a doc", function()
    local text = quietly(attn.help)
    local bm = text:match("\nattn%.block_mask:\n([^\n]*)\n")
    assert.are.equal("  and_ causal document or_ sliding_window", bm)
    assert.is_truthy(text:find("\nattn.optim:\n  Adam AdamW Optimizer SGD\n", 1, true))
    assert.is_truthy(text:find("\nattn.checkpoint (require \"attn.checkpoint\"):\n  load save\n", 1, true))
    local missing = {}
    for _, area in ipairs(help.areas()) do
      if not pcall(help.text, area.name) then missing[#missing + 1] = area.name end
      for _, n in ipairs(help.area_names(area, help.index())) do
        if not pcall(help.text, area.name .. "." .. n) then missing[#missing + 1] = area.name .. "." .. n end
      end
    end
    assert.are.equal("", table.concat(missing, ", "))
    assert.is_truthy(help.text("autograd.grad"):find("^attn%.autograd%.grad\nThe gradients of"))
    assert.is_truthy(help.text("block_mask.sliding_window"):find("^attn%.block_mask%.sliding_window\n"))
  end)

  it("is built from what is there: a table added to attn appears with its names", function()
    assert.is_nil(rawget(attn, "tokenizer_for_help_spec"))
    attn.tokenizer_for_help_spec = { gpt2 = function() end, _private = 1 }
    local ok, text = pcall(quietly, attn.help)
    attn.tokenizer_for_help_spec = nil
    assert(ok, text)
    assert.is_truthy(text:find("\nattn.tokenizer_for_help_spec:\n  gpt2\n", 1, true), text)
    assert.is_falsy(quietly(attn.help):find("tokenizer_for_help_spec", 1, true))
  end)
end)

describe("attn.help of an nn class", function()
  it("lists the public methods only: no _private ones, none of the classes' own plumbing", function()
    local internals = { "direct_call", "recording", "linears_recording", "init", "extend", "is_module", "pyfloat",
                        "forward_modules", "forward_cached" }
    for _, cls in ipairs { "nn.Linear", "nn.MultiHeadAttention", "nn.CausalAttention", "nn.GroupedQueryAttention",
                           "nn.Module" } do
      local text = quietly(attn.help, cls)
      assert.is_falsy(text:find("\n  m:_", 1, true), cls)
      for _, name in ipairs(internals) do
        assert.is_falsy(text:find("\n  m:" .. name .. "%f[^%w_]"), cls .. " lists " .. name)
      end
      for _, name in ipairs { "forward", "parameters", "state_dict", "load_state_dict", "train", "eval", "zero_grad" } do
        assert.is_truthy(text:find("\n  m:" .. name .. "%f[^%w_]"), cls .. " lacks " .. name)
      end
    end
    assert.is_truthy(quietly(attn.help, "nn.MultiHeadAttention"):find("\n  m:reset_cache  ", 1, true))
  end)
end)

describe("make doc", function()
  -- As an unprivileged user (nobody, when the spec runs as root) that
  -- cannot install, with an LDoc that is not there and a package list with
  -- one that does not exist: the error names what to install.
  it("names the Debian packages it needs when it cannot install them", function()
    local function sh(cmd)
      local p = io.popen(cmd .. " 2>&1")
      local out = p:read("a")
      local ok = p:close()
      return ok, out
    end
    local uid = io.popen("id -u"):read("l")
    local prefix = ""
    if uid == "0" then
      if not sh("command -v setpriv") then pending("needs setpriv to drop root") return end
      prefix = "setpriv --reuid=nobody --regid=nogroup --clear-groups "
      if not sh(prefix .. "test -r Makefile") then pending("nobody cannot read this checkout") return end
    elseif sh("sudo -n true") then
      pending("sudo works here without a password: make doc would install") return
    end
    local ok, out = sh("HOME=/tmp " .. prefix .. "make -s doc LDOC=attn-no-such-ldoc"
      .. " DOC_PACKAGES='lua-ldoc attn-no-such-package'")
    assert.is_falsy(ok, out)
    assert.is_truthy(out:find("attn: missing Debian packages: lua-ldoc attn-no-such-package -- install them with: "
      .. "sudo apt-get install lua-ldoc attn-no-such-package", 1, true), out)
    assert.is_truthy(out:find("attn: 'make doc' needs LDoc (Debian packages: lua-ldoc attn-no-such-package)", 1, true), out)
  end)
end)
