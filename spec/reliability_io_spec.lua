-- Reliability of I/O and the binding: long lists on the Lua stack,
-- metamethods with a wrong self, finalizers that change save_safetensors'
-- arguments during the call, FIFOs, one file descriptor per load and atomic
-- saves, the REPL's error printing and paths / .npy headers with stray bytes. Whatever could crash runs
-- in a child lua5.4 (scripts/attn-lua, which the ASan run points at its own
-- build), so that a crash fails one spec instead of the whole run.
local attn = require "attn"

local function tmpname(ext)
  local p = os.tmpname()
  os.remove(p)
  return p .. (ext or "")
end

local function read_bytes(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- Run a Lua script in a child (with `timeout`), return its output and exit code.
local function run_child(script, limit, env)
  local path = tmpname(".lua")
  write_bytes(path, script)
  local p = assert(io.popen(("%s timeout %d scripts/attn-lua %s 2>&1; echo \"rc=$?\""):format(env or "",
    limit or 60, path)))
  local out = p:read("a")
  p:close()
  os.remove(path)
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), rc
end

local function expect_error(fn, ...)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  err = tostring(err)
  for _, piece in ipairs({ ... }) do
    assert.is_truthy(err:find(piece, 1, true), "expected '" .. piece .. "' in: " .. err)
  end
  return err
end

-- The names in directory dir (ls -A), sorted, as one string.
local function listing(dir)
  local p = assert(io.popen("ls -A '" .. dir .. "'"))
  local s = p:read("a")
  p:close()
  return s
end

local function mkdtemp()
  local p = assert(io.popen("mktemp -d"))
  local d = p:read("l")
  p:close()
  return d
end

describe("lists of any length on the Lua stack", function()
  it("cat and stack join 100000 tensors, at top level and inside a coroutine; a 200-head wrapper runs", function()
    local out, rc = run_child([[
      local attn = require "attn"
      local list = {}
      for i = 1, 100000 do list[i] = attn.full({1}, i % 7) end
      local function check(t, n)
        assert(t:numel() == n, "numel " .. t:numel())
        local want = 0
        for i = 1, n do want = want + i % 7 end
        assert(t:sum():item() == want, "sum")
        assert(t[n // 2] == (n // 2) % 7 and t[n] == n % 7, "order")
      end
      check(attn.cat(list), 100000)
      check(attn.stack(list):view(-1), 100000)
      check(coroutine.wrap(function() return attn.cat(list) end)(), 100000)
      check(coroutine.wrap(function() return attn.stack(list, 1):view(-1) end)(), 100000)
      -- a coroutine nested in a coroutine, 1000 parts with 2 dims, cat along dim 2
      local rows = {}
      for i = 1, 1000 do rows[i] = attn.full({2, 1}, i) end
      local t = coroutine.wrap(function() return coroutine.wrap(function() return attn.cat(rows, 2) end)() end)()
      assert(t:size(1) == 2 and t:size(2) == 1000 and t[2][1000] == 1000, "nested coroutine cat")
      attn.manual_seed(1)
      local w = attn.nn.MultiHeadAttentionWrapper(4, 1, 8, 0.0, 200)
      local x = attn.rand(2, 5, 4)
      local y = w(x)
      assert(y:size(1) == 2 and y:size(2) == 5 and y:size(3) == 200, "wrapper shape")
      assert(attn.allclose(y:narrow(3, 7, 1), w.heads[7](x)), "head 7")
      local yc = coroutine.wrap(function() return w(x) end)()
      assert(attn.equal(y, yc), "wrapper in a coroutine")
      print("ok")
    ]], 120)
    assert.are.equal(0, rc, out)
    assert.are.equal("ok\n", out)
  end)

  it("still checks every element of the list, naming it", function()
    expect_error(function() attn.cat({ attn.ones(1), attn.ones(1), 5 }) end,
      "attn.cat: element 3 of the list is a number, expected attn.Tensor")
    expect_error(function() attn.stack({}) end, "attn.stack: expected a non-empty list of tensors")
  end)

  it("the REPL prints an expression with 100000 values without going quadratic", function()
    local out, rc = run_child([[
      local repl = require "attn.tools.repl"
      local lines, i, got = { "table.unpack(setmetatable({}, {__index = function(_, k) return k end}), 1, 100000)" }, 0, {}
      local t0 = os.clock()
      repl.loop { read = function() i = i + 1 return lines[i] end, write = function(s) got[#got + 1] = s end, env = _G }
      local text = table.concat(got)
      assert(text:sub(1, 6) == "1\t2\t3\t" and text:sub(-8) == "\t100000\n", text:sub(1, 100))
      assert(os.clock() - t0 < 10, "took " .. (os.clock() - t0) .. " s")
      print("ok")
    ]], 60)
    assert.are.equal("ok\n", out)
    assert.are.equal(0, rc)
  end)
end)

describe("metamethods and methods with a wrong self", function()
  it("raise a Lua error for every function in the metatable and the methods table", function()
    local out, rc = run_child([[
      local attn = require "attn"
      local mt = getmetatable(attn.ones(2))
      local fake = setmetatable({}, { __name = "attn.Tensor" })
      local selves = { {}, 1, false, "s", fake, print, coroutine.create(print), 2.5 }
      local fns = {}
      for k, v in pairs(attn.Tensor) do fns["Tensor." .. k] = v end
      for k, v in pairs(mt) do if type(v) == "function" then fns["metatable." .. k] = v end end
      local names = {}
      for k in pairs(fns) do names[#names + 1] = k end
      table.sort(names)
      local bad = {}
      for _, name in ipairs(names) do
        for si = 0, #selves do
          local self = selves[si] -- selves[0] is nil
          for _, second in ipairs({ "shape", 1, self or 0 }) do
            local ok, err = pcall(fns[name], self, second, second)
            if ok then bad[#bad + 1] = name .. "(" .. type(self) .. ", " .. tostring(second) .. ") did not raise"
            elseif type(err) ~= "string" or not (err:find("expected", 1, true) or err:find("attn.Tensor", 1, true)) then
              bad[#bad + 1] = name .. ": " .. tostring(err)
            end
          end
        end
      end
      print(#bad == 0 and "ok " .. #names or table.concat(bad, "\n"))
    ]], 60)
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:match("^ok %d+\n$"), out)
    assert.is_true(tonumber(out:match("%d+")) > 70)
  end)

  it("names the metamethod and what came", function()
    local mt = getmetatable(attn.ones(2))
    expect_error(function() mt.__len({}) end, "attn.Tensor length: bad argument #1 'self' (expected attn.Tensor, got table)")
    expect_error(function() mt.__index(1, "shape") end, "attn.Tensor index: bad argument #1 'self' (expected attn.Tensor, got number)")
    expect_error(function() mt.__newindex(setmetatable({}, { __name = "attn.Tensor" }), 1, 2) end,
      "attn.Tensor index assignment: bad argument #1 'self' (expected attn.Tensor, got table (not an attn.Tensor))")
    expect_error(function() mt.__add(1, 2) end, "attn.add: expected at least one attn.Tensor operand, got number and number")
    expect_error(function() attn.Tensor.float({}) end, "Tensor:float: bad argument #1 'self' (expected attn.Tensor, got table)")
    -- the ordinary uses keep working
    local t = attn.ones(2, 3)
    assert.are.equal(2, #t)
    assert.are.same({ 2, 3 }, t.shape)
    assert.are.equal(3, (t + 2)[1][1])
    assert.are.equal(3, (2 + t)[1][1])
  end)
end)

describe("save_safetensors while a finalizer changes its arguments", function()
  it("writes the tensors and metadata the tables held when the call began, or raises; never crashes", function()
    local out, rc = run_child([[
      local attn = require "attn"
      local path = os.tmpname()
      local hits, saved = 0, 0
      for round = 1, 60 do
        local tensors, meta = {}, {}
        for i = 1, 40 do tensors["t" .. i] = attn.full({ 3 }, i) meta["k" .. i] = "v" .. i end
        local mutated, sentinel = false, false
        collectgarbage()
        collectgarbage("stop")
        collectgarbage("incremental", 100, 10, 1) -- steps of a few objects each
        -- Finalizers run newest first, 10 per step: the mutator, made before
        -- the 10 sentinels, is left pending when the sentinels have run, and
        -- runs at the first allocation once the collector runs again: inside
        -- the call. It swaps every tensor for a string and every metadata
        -- value for a table.
        setmetatable({}, { __gc = function()
          mutated = true
          for k in pairs(tensors) do tensors[k] = "gone" end
          for k in pairs(meta) do meta[k] = {} end
        end })
        for _ = 1, 10 do setmetatable({}, { __gc = function() sentinel = true end }) end
        for _ = 1, 1000000 do
          if sentinel then break end
          collectgarbage("step", 0)
        end
        assert(sentinel and not mutated, "the finalizers did not run as planned")
        collectgarbage("restart")
        local ok, err = pcall(attn.save_safetensors, path, tensors, meta)
        collectgarbage("incremental", 200, 100, 13)
        if mutated then hits = hits + 1 end
        if ok then
          local d, m = attn.load_safetensors(path)
          for i = 1, 40 do
            assert(d["t" .. i] and d["t" .. i][2] == i, "tensor t" .. i)
            assert(m["k" .. i] == "v" .. i, "metadata k" .. i)
          end
          saved = saved + 1
        else
          assert(tostring(err):find("attn.save_safetensors: bad argument", 1, true), err)
        end
      end
      os.remove(path)
      print("hits " .. hits .. " saved " .. saved)
    ]], 120)
    assert.are.equal(0, rc, out)
    local hits = tonumber(out:match("^hits (%d+)"))
    assert.is_truthy(hits, out)
    assert.is_true(hits > 0, "the finalizer never ran inside the call: " .. out)
  end)
end)

describe("loading a FIFO", function()
  it("attn.load, attn.load_safetensors and m:load refuse it at once instead of blocking", function()
    local fifo = tmpname(".fifo")
    assert.is_true(os.execute("mkfifo '" .. fifo .. "'"))
    local out, rc = run_child(([[
      local attn = require "attn"
      local fifo = %q
      local lin = attn.nn.Linear(2, 2)
      print(pcall(attn.load, fifo))
      print(pcall(attn.load_safetensors, fifo))
      print(pcall(lin.load, lin, fifo))
    ]]):format(fifo), 20)
    os.remove(fifo)
    assert.are.equal(0, rc, "the child blocked or failed: " .. out)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(3, #lines, out)
    assert.is_truthy(lines[1]:find("false\tattn.load: cannot read '" .. fifo .. "': not a regular file", 1, true), out)
    assert.is_truthy(lines[2]:find("false\tattn.load_safetensors: " .. fifo .. ": cannot read it: not a regular file", 1, true), out)
    assert.is_truthy(lines[3]:find("false\tLinear:load: " .. fifo .. ": cannot read it: not a regular file", 1, true), out)
  end)
end)

-- A child that replaces `target` by a copy of file a, then of file b, by
-- rename, until `stop` exists (at most 120 s).
local SWAPPER = [[
  local a, b, target, stop = arg[1], arg[2], arg[3], arg[4]
  local function slurp(p) local f = assert(io.open(p, "rb")) local s = f:read("a") f:close() return s end
  local bytes = { slurp(a), slurp(b) }
  local tmp = target .. ".swap"
  local t0, n = os.time(), 0
  while os.time() - t0 < 120 do
    n = n + 1
    local f = assert(io.open(tmp, "wb"))
    f:write(bytes[n % 2 + 1])
    f:close()
    assert(os.rename(tmp, target))
    if n % 16 == 0 and io.open(stop) then break end
  end
]]

describe("a file replaced by rename while it loads", function()
  local function swap_test(save, load, same_as)
    local dir = mkdtemp()
    local a, b, target, stop = dir .. "/a", dir .. "/b", dir .. "/target", dir .. "/stop"
    -- different sizes: a header of one with the data of the other is wrong or truncated
    save(attn.full({ 20000 }, 1), a)
    save(attn.full({ 40000 }, 2), b)
    save(attn.full({ 20000 }, 1), target)
    write_bytes(dir .. "/swapper.lua", SWAPPER)
    os.execute(("lua5.4 '%s/swapper.lua' '%s' '%s' '%s' '%s' >/dev/null 2>&1 &"):format(dir, a, b, target, stop))
    local want = { load(a), load(b) }
    local bad, seen = {}, { 0, 0 }
    for _ = 1, 1500 do
      local ok, t = pcall(load, target)
      if ok and same_as(t, want[1]) then seen[1] = seen[1] + 1
      elseif ok and same_as(t, want[2]) then seen[2] = seen[2] + 1
      else bad[#bad + 1] = ok and "a mix of the two files" or tostring(t) end
    end
    write_bytes(stop, "")
    os.execute("sleep 0.3")
    os.execute("rm -rf '" .. dir .. "'")
    assert.are.same({}, bad)
    assert.is_true(seen[1] > 0 and seen[2] > 0, "the swapper did not swap: " .. seen[1] .. ", " .. seen[2])
  end

  it("attn.load returns one file or the other, never a header of one with the data of the other", function()
    swap_test(attn.save, attn.load, function(t, w) return attn.equal(t, w) end)
  end)

  it("attn.load_safetensors likewise", function()
    swap_test(function(t, p) attn.save_safetensors(p, { x = t }) end, function(p) return attn.load_safetensors(p) end,
      function(d, w) return d.x ~= nil and attn.equal(d.x, w.x) end)
  end)
end)

describe("saves write a temporary file and rename it", function()
  -- A child under `ulimit -f` (SIGXFSZ ignored): writes past 64 KiB fail with EFBIG.
  local function save_past_limit(code)
    return run_child(code, 60, "trap '' XFSZ; ulimit -f 128;")
  end

  it("a failed attn.save, save_safetensors or m:save leaves the previous file intact and no temporary file", function()
    local dir = mkdtemp()
    local npy, st, mod = dir .. "/old.npy", dir .. "/old.safetensors", dir .. "/mod.safetensors"
    attn.save(attn.full({ 5 }, 3), npy)
    attn.save_safetensors(st, { w = attn.full({ 5 }, 4) })
    local lin = attn.nn.Linear(2, 2)
    lin:save(mod)
    local before = { read_bytes(npy), read_bytes(st), read_bytes(mod) }
    local names = listing(dir)
    local out, rc = save_past_limit(([[
      local attn = require "attn"
      local big = attn.ones(100000)
      print(pcall(attn.save, big, %q))
      print(pcall(attn.save_safetensors, %q, { w = big }))
      print(pcall(function() local l = attn.nn.Linear(300, 300) return l:save(%q) end))
    ]]):format(npy, st, mod))
    assert.are.equal(0, rc, out)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.equal(3, #lines, out)
    assert.is_truthy(lines[1]:find("^false\tattn.save: cannot write '" .. npy .. "': File too large"), out)
    assert.is_truthy(lines[2]:find("^false\tattn.save_safetensors: " .. st .. ": cannot write the file: File too large"), out)
    assert.is_truthy(lines[3]:find("^false\tLinear:save: " .. mod .. ": cannot write the file: File too large"), out)
    assert.are.same(before, { read_bytes(npy), read_bytes(st), read_bytes(mod) })
    assert.are.equal(names, listing(dir))
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("a successful save replaces the file, keeps its permissions and leaves nothing else behind", function()
    local dir = mkdtemp()
    local npy = dir .. "/w.npy"
    attn.save(attn.full({ 5 }, 3), npy)
    os.execute("chmod 640 '" .. npy .. "'")
    attn.save(attn.full({ 2, 2 }, 7), npy)
    assert.is_true(attn.equal(attn.full({ 2, 2 }, 7), attn.load(npy)))
    local p = io.popen("stat -c %a '" .. npy .. "'")
    assert.are.equal("640", p:read("l"))
    p:close()
    assert.are.equal("w.npy\n", listing(dir))
    -- through a symlink: the link stays a link, its target gets the new data
    os.execute("ln -s w.npy '" .. dir .. "/link.npy'")
    attn.save(attn.full({ 3 }, 9), dir .. "/link.npy")
    assert.is_true(attn.equal(attn.full({ 3 }, 9), attn.load(npy)))
    p = io.popen("test -L '" .. dir .. "/link.npy' && echo link")
    assert.are.equal("link", p:read("l"))
    p:close()
    attn.save_safetensors(dir .. "/s.safetensors", { a = attn.ones(2) })
    attn.save_safetensors(dir .. "/s.safetensors", { b = attn.ones(3) })
    assert.are.equal(3, attn.load_safetensors(dir .. "/s.safetensors").b:numel())
    assert.are.equal("link.npy\ns.safetensors\nw.npy\n", listing(dir))
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("a save into a missing directory names the path and creates nothing", function()
    expect_error(function() attn.save(attn.ones(2), "/nonexistent-dir/x.npy") end,
      "attn.save: cannot open '/nonexistent-dir/x.npy' for writing: No such file or directory")
    expect_error(function() attn.save(attn.ones(2), "") end, "attn.save: cannot open '' for writing: No such file or directory")
    expect_error(function() attn.save_safetensors("/nonexistent-dir/x.st", { a = attn.ones(2) }) end,
      "attn.save_safetensors: /nonexistent-dir/x.st: cannot open the file for writing: No such file or directory")
  end)
end)

describe("stray bytes in paths and .npy headers", function()
  it("a path with an embedded NUL is an error, not a shorter path", function()
    local dir = mkdtemp()
    local p = dir .. "/a\0b"
    local lin = attn.nn.Linear(2, 2)
    expect_error(function() attn.save(attn.ones(2), p) end, "attn.save: bad argument #2 'path' (a string with an embedded NUL byte)")
    expect_error(function() attn.load(p) end, "attn.load: bad argument #1 'path' (a string with an embedded NUL byte)")
    expect_error(function() attn.save_safetensors(p, { a = attn.ones(2) }) end,
      "attn.save_safetensors: bad argument #1 'path' (a string with an embedded NUL byte)")
    expect_error(function() attn.load_safetensors(p) end,
      "attn.load_safetensors: bad argument #1 'path' (a string with an embedded NUL byte)")
    expect_error(function() lin:save(p) end, "Linear:save: bad argument #1 'path' (a string with an embedded NUL byte)")
    expect_error(function() lin:load(p) end, "Linear:load: bad argument #1 'path' (a string with an embedded NUL byte)")
    expect_error(function() attn.viz.heatmap(attn.ones(2, 2), { file = p }) end,
      "attn.viz.heatmap: bad option 'file' (a path with an embedded NUL byte)")
    assert.are.equal("", listing(dir))
    os.execute("rm -rf '" .. dir .. "'")
  end)

  local function npy(header)
    local h = header .. string.rep(" ", (64 - (10 + #header + 1) % 64) % 64) .. "\n"
    return "\x93NUMPY\1\0" .. string.char(#h % 256, #h // 256) .. h
  end

  it("refuses a descr with a NUL inside and a size with leading zeros, as NumPy's literal_eval does", function()
    local path = tmpname(".npy")
    local data = string.rep("\0", 8)
    write_bytes(path, npy("{'descr': '<f4\0junk', 'fortran_order': False, 'shape': (2,), }") .. data)
    expect_error(function() attn.load(path) end, "is not a valid .npy file: a control character in a string in its header")
    write_bytes(path, npy("{'descr\0': '<f4', 'fortran_order': False, 'shape': (2,), }") .. data)
    expect_error(function() attn.load(path) end, "a control character in a string")
    write_bytes(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0002,), }") .. data)
    expect_error(function() attn.load(path) end, "is not a valid .npy file: a size with a leading zero in 'shape' in its header")
    write_bytes(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 01), }") .. data)
    expect_error(function() attn.load(path) end, "a size with a leading zero")
    -- what NumPy accepts still loads: 0 and 00 are zero, 2L is Python 2's long
    write_bytes(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0), }"))
    assert.are.same({ 2, 0 }, attn.load(path):size())
    write_bytes(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (00,), }"))
    assert.are.same({ 0 }, attn.load(path):size())
    write_bytes(path, npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2L,), }") .. data)
    assert.are.same({ 2 }, attn.load(path):size())
    os.remove(path)
  end)
end)

-- The REPL through a pipe (no terminal: no prompts), as spec/repl_spec.lua does.
local function run_repl(input)
  local path = tmpname(".txt")
  write_bytes(path, input)
  local p = assert(io.popen("timeout 60 scripts/attn-lua < " .. path .. " 2>&1; echo \"rc=$?\""))
  local out = p:read("a")
  p:close()
  os.remove(path)
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""):gsub("^[^\n]*\n", "", 1), rc -- without the banner
end

describe("the REPL survives values and errors whose __tostring fails", function()
  it("prints an error for each and goes on", function()
    local out, rc = run_repl(table.concat({
      "x = setmetatable({}, {__tostring = function() error('boom') end})",
      "x",
      "1, x",
      "error(x)",
      "error(setmetatable({}, {__tostring = function() return 42 end}))", -- a number is a string to tostring
      "setmetatable({}, {__tostring = function() return {} end})",
      "error(setmetatable({}, {__tostring = function() error(setmetatable({}, {__tostring = function() error('deeper') end})) end}))",
      "error(setmetatable({}, {__metatable = 7}))",
      "print('after')",
    }, "\n") .. "\n")
    assert.are.equal(0, rc, out)
    assert.are.equal(table.concat({
      "error: cannot print the value: __tostring raised an error: boom",
      "error: cannot print the value: __tostring raised an error: boom",
      "error: (error object is a table value; its __tostring raised an error: boom)",
      "error: 42",
      "error: cannot print the value: __tostring raised an error: '__tostring' must return a string",
      "error: (error object is a table value; its __tostring raised an error: (error object is a table value))",
      "error: (error object is a table value)",
      "after",
    }, "\n") .. "\n", out)
  end)
end)

describe("errors in a module's forward, in the REPL", function()
  it("name Class:forward and no file of attn's own", function()
    local out, rc = run_repl(table.concat({
      "m = nn.Linear(2,3)",
      "m(attn.ones(4))",
      "y = m(attn.ones(4))",
      "c = nn.CausalAttention(2, 3, 4, 0.0)",
      "c(attn.ones(1, 2, 2), {need_weights = 1})",
      "h = nn.MultiHeadAttention(2, 4, 4, 0.0, 2)",
      "h(attn.ones(1, 2, 2), 5)",
      "d = nn.Dropout(0.5)",
      "d(1)",
      "h.W_query = nn.Linear(2, 5)",
      "h(attn.ones(1, 2, 2))",
      "M = nn.Module:extend('M')",
      "function M:forward(x) return x + attn.ones(7) end",
      "M()(attn.ones(3))",
    }, "\n") .. "\n")
    assert.are.equal(0, rc, out)
    assert.are.equal(table.concat({
      "error: Linear:forward: input of shape [4] does not end in in_features = 2",
      "error: Linear:forward: input of shape [4] does not end in in_features = 2",
      -- (the options' own message names the class, as spec/nn_need_weights_spec.lua checks)
      "error: CausalAttention:forward: attn.nn.CausalAttention: bad option 'need_weights' (expected boolean, got 1)",
      "error: MultiHeadAttention:forward: attn.nn.MultiHeadAttention: bad argument #2 'opts' (expected a table of options, got 5)",
      "error: Dropout:forward: attn.dropout: bad argument #1 'input' (expected attn.Tensor, got number)",
      "error: MultiHeadAttention:forward: Tensor:view: shape [1, 2, 2, 2] is invalid for input of size 10 (shape [1, 2, 5])",
      "error: M:forward: stdin:1: attn.add: shapes [3] and [7] cannot be broadcast (3 ~= 7 at dim 1)",
    }, "\n") .. "\n", out)
  end)

  it("keep the caller's position outside the REPL, and pass error objects through", function()
    local d = attn.nn.Dropout(0.5)
    local ok, err = pcall(function() return (d(1)) end)
    assert.is_false(ok)
    assert.is_truthy(err:find("^spec/reliability_io_spec.lua:%d+: Dropout:forward: attn.dropout: "), err)
    local M = attn.nn.Module:extend("M")
    local obj = {}
    function M:forward() error(obj) end
    ok, err = pcall(function() return (M()()) end)
    assert.are.equal(obj, err)
  end)
end)

describe("load_state_dict while the state dict changes under it (found by fuzz.lua's finalizer kind)", function()
  it("reads each entry once: what is checked is what is copied", function()
    local m = attn.nn.Linear(3, 2)
    local w, b = attn.full({ 2, 3 }, 0.5), attn.full({ 2 }, -1)
    -- each read of "weight" after the first gives a string, as a finalizer
    -- replacing the entry between the checks and the copy would
    local reads = 0
    local d = setmetatable({ bias = b }, { __index = function(_, k)
      if k ~= "weight" then return nil end
      reads = reads + 1
      return reads == 1 and w or "replaced"
    end })
    m:load_state_dict(d, false)
    assert.are.equal(1, reads)
    assert.are.same({ { 0.5, 0.5, 0.5 }, { 0.5, 0.5, 0.5 } }, m.weight:totable())
    assert.are.same({ -1, -1 }, m.bias:totable())
  end)
end)
