-- Run every notebook port (scripts/examples/seeds/NNN_*.lua) and compare the tensors it
-- prints with the tensors the reference notebook printed
-- (spec/fixtures/seeds_expected.lua, copied from shared/seeds).
--
--   scripts/attn-lua scripts/examples/check_seeds.lua [--verbose] [NNN ...]
--
-- Expected tensors are matched in order: each is looked for among the port's
-- prints after the previous match. The autograd suffixes (grad_fn=<...>,
-- requires_grad=True) must be the same. Values agree when they are within one unit
-- of the printed 4th digit (fixed: 1e-4, scientific: 1e-4 of the power of ten);
-- shapes must be equal (for prints the notebook text cuts short, the printed
-- prefix of the values must agree). Exit status 1 if anything did not match.

local here = arg and arg[0] and arg[0]:match("^(.*)/[^/]*$") or "scripts/examples"
local root = here .. "/../.."

local verbose = false
local only = {}
for _, a in ipairs(arg or {}) do
  if a == "--verbose" or a == "-v" then verbose = true
  else only[a] = true end
end

local M = {}

--- The `tensor(...)` prints in a text: list of {text = ..., truncated = bool}.
function M.printed_tensors(text)
  local out = {}
  local pos = 1
  while true do
    local s, e = text:find("tensor%(", pos)
    if not s then break end
    local prev = s > 1 and text:sub(s - 1, s - 1) or ""
    if prev:match("[%w_.]") then
      pos = e + 1
    else
      local depth, i = 0, e
      while i <= #text do
        local c = text:sub(i, i)
        if c == "(" then depth = depth + 1
        elseif c == ")" then
          depth = depth - 1
          if depth == 0 then break end
        end
        i = i + 1
      end
      out[#out + 1] = { text = text:sub(s, i), truncated = depth ~= 0 }
      pos = i + 1
    end
  end
  return out
end

--- Numbers and shape of a printed tensor. Shape is nil when it cannot be known.
function M.parse(t)
  local body = t.text:gsub(",%s*grad_fn=<%w+>", ""):gsub(",%s*size=%b()", "")
  body = body:gsub("^tensor%(", "")
  local values, tokens = {}, {}
  for tok in body:gmatch("[-%w.+]+") do
    if tok == "inf" or tok == "-inf" or tok == "nan" or tok:match("^-?%d") then
      tokens[#tokens + 1] = tok
    end
  end
  -- a print cut short may end inside a number: drop it
  if t.truncated and not body:match("[,%]]%s*$") then tokens[#tokens] = nil end
  for _, tok in ipairs(tokens) do
    local v = tok == "inf" and math.huge or tok == "-inf" and -math.huge or tok == "nan" and 0 / 0 or tonumber(tok)
    values[#values + 1] = { value = v, sci = tok:find("e") ~= nil, token = tok }
  end
  if t.truncated then return values, nil end
  -- shape from the bracket structure: count elements at each depth in the first run
  local shape, depth, counts = {}, 0, {}
  local maxdepth = 0
  for c in body:gmatch("[%[%],]") do
    if c == "[" then
      depth = depth + 1
      counts[depth] = 1
      if depth > maxdepth then maxdepth = depth end
    elseif c == "]" then
      if not shape[depth] then shape[depth] = counts[depth] end
      depth = depth - 1
    elseif c == "," and depth > 0 then
      counts[depth] = counts[depth] + 1
    end
  end
  if maxdepth == 0 then return values, {} end
  -- empty last dim: "[]"
  if #values == 0 then shape[maxdepth] = 0 end
  return values, shape
end

local function close(a, b)
  if a.value ~= a.value or b.value ~= b.value then return a.value ~= a.value and b.value ~= b.value end
  if a.value == b.value then return true end
  local tol = 1.01e-4
  if a.sci or b.sci then
    local ref = math.max(math.abs(a.value), math.abs(b.value))
    tol = 1.01e-4 * 10 ^ math.floor(math.log(ref, 10))
  end
  return math.abs(a.value - b.value) <= tol
end

--- The autograd suffix of a printed tensor: "grad_fn=<MmBackward0>",
-- "requires_grad=True", or "" (none).
function M.suffix(t)
  return t.text:match("grad_fn=<[%w:]+>") or t.text:match("requires_grad=True") or ""
end

--- Does printed tensor `got` agree with expected tensor `want` (values, shape and autograd suffix)?
function M.agree(want, got)
  if not want.truncated and M.suffix(want) ~= M.suffix(got) then
    return false, string.format("suffix %q vs %q", M.suffix(want), M.suffix(got))
  end
  local wv, ws = M.parse(want)
  local gv, gs = M.parse(got)
  if ws and gs then
    if #ws ~= #gs then return false, "rank differs" end
    for i = 1, #ws do
      if ws[i] ~= gs[i] then return false, "shape differs" end
    end
    if #wv ~= #gv then return false, "element count differs" end
  elseif #gv < #wv then
    return false, "fewer values"
  end
  for i = 1, #wv do
    if not close(wv[i], gv[i]) then
      return false, string.format("value %d: %s vs %s", i, wv[i].token, gv[i].token)
    end
  end
  return true
end

local function run_port(path)
  local cmd = string.format("%s/scripts/attn-lua %q 2>&1", root, path)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  local ok, _, code = p:close()
  return out, ok, code
end

local function main()
  local expected = dofile(root .. "/spec/fixtures/seeds_expected.lua")
  local all_ok = true
  for _, nb in ipairs(expected) do
    if next(only) == nil or only[nb.notebook] then
      local listing = io.popen("ls " .. here .. "/seeds/" .. nb.notebook .. "_*.lua 2>/dev/null")
      local path = listing:read("l")
      listing:close()
      local wanted, matched = 0, 0
      local detail = {}
      if not path then
        all_ok = false
        print(string.format("%s: no port scripts/examples/seeds/%s_*.lua", nb.notebook, nb.notebook))
      else
        local out, ok, code = run_port(path)
        if not ok then
          all_ok = false
          detail[#detail + 1] = "  the port exited with status " .. tostring(code) .. ":\n" .. out
        end
        local printed = M.printed_tensors(out)
        local cursor = 1
        for _, want in ipairs(nb.tensors) do
          if want.compare then
            wanted = wanted + 1
            local found, why
            for j = cursor, #printed do
              local agree, reason = M.agree(want, printed[j])
              if agree then found = j break end
              why = why or reason
            end
            if found then
              matched = matched + 1
              cursor = found + 1
            else
              detail[#detail + 1] = string.format("  line %d of %s not found among the port's prints after #%d (%s):\n%s",
                want.line, nb.file, cursor - 1, why or "nothing printed", want.text)
            end
          end
        end
        print(string.format("%s: %d/%d printed tensors matched (%s)", nb.notebook, matched, wanted,
          path:match("[^/]*$")))
        if matched < wanted then all_ok = false end
      end
      if verbose or not all_ok then
        for _, d in ipairs(detail) do print(d) end
      end
    end
  end
  return all_ok
end

if ... == nil or not package.loaded["check_seeds"] then
  -- run as a script (not when required by a spec)
  if arg and arg[0] and arg[0]:find("check_seeds%.lua$") then
    os.exit(main() and 0 or 1)
  end
end

M.main = main
return M
