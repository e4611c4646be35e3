-- attn.tokenizer.gpt2: GPT-2's byte-level BPE (src/core/tokenizer.c) against
-- the ids of the reference encoder (spec/fixtures/gpt2_tokens.lua, written by
-- scripts/fixtures/make_tokenizer_fixtures.js with the npm package
-- gpt-3-encoder 1.1.4), round trips, the special token and the errors.
local attn = require "attn"
local C = dofile("spec/fixtures/tensor_check.lua")
local fixture = dofile("spec/fixtures/gpt2_tokens.lua")

local tok = attn.tokenizer.gpt2()

local function plus(ids, k)
  local out = {}
  for i, v in ipairs(ids) do out[i] = v + k end
  return out
end

local function concat(...)
  local out = {}
  for _, t in ipairs({...}) do
    for _, v in ipairs(t) do out[#out + 1] = v end
  end
  return out
end

local function case(name)
  for _, c in ipairs(fixture.cases) do
    if c.name == name then return c end
  end
  error("no fixture case " .. name)
end

describe("attn.tokenizer.gpt2", function()
  it("has GPT-2's 50257 ids, <|endoftext|> last (tiktoken's 50256, + 1)", function()
    assert.are.equal(50257, tok.n_vocab)
    assert.are.equal(50257, tok.eot)
    assert.are.equal("<|endoftext|>", tok:decode({tok.eot}))
    assert.are.equal("<|endoftext|>", tok:decode({50256}, {base = 0}))
  end)

  it("encodes 'Hello, world' as tiktoken's gpt2 [15496, 11, 995] (+ 1 in base 1)", function()
    assert.are.same({15496, 11, 995}, tok:encode("Hello, world", {base = 0}))
    assert.are.same({15497, 12, 996}, tok:encode("Hello, world"))
  end)

  for _, c in ipairs(fixture.cases) do
    it("encodes as the reference encoder: " .. c.name, function()
      -- the reference reads "<|endoftext|>" as plain text
      local opts = {base = 0, disallowed_special = {}}
      assert.are.same(c.ids, tok:encode(c.text, opts))
      assert.are.same(plus(c.ids, 1), tok:encode(c.text, {disallowed_special = {}}))
    end)
    it("decodes to the text again: " .. c.name, function()
      assert.are.equal(c.text, tok:decode(plus(c.ids, 1)))
      assert.are.equal(c.text, tok:decode(c.ids, {base = 0}))
      assert.are.equal(c.text, tok:decode(tok:encode(c.text, {disallowed_special = {}})))
    end)
  end

  it("the fixture covers every class of the pattern (letters, numbers, spaces, other; astral code points)", function()
    assert.is_true(#fixture.cases >= 25)
    assert.truthy(case("astral letters and digits").text:find("\240", 1, true))
    assert.truthy(case("CRLF").text:find("\r\n", 1, true))
  end)
end)

describe("tok:encode and <|endoftext|>", function()
  local a, b = tok:encode("a", {base = 0}), tok:encode(" b", {base = 0})
  it("is one end-of-text id where allowed, as tiktoken's allowed_special", function()
    assert.are.same(concat(a, {50256}, b, {50256}),
      tok:encode("a<|endoftext|> b<|endoftext|>", {allowed_special = {"<|endoftext|>"}, base = 0}))
    assert.are.same(concat(plus(a, 1), {tok.eot}, plus(b, 1)),
      tok:encode("a<|endoftext|> b", {allowed_special = "all"}))
    assert.are.same({tok.eot, tok.eot}, tok:encode("<|endoftext|><|endoftext|>", {allowed_special = "all"}))
  end)
  it("raises where not allowed, naming the option and the byte offset (tiktoken raises too)", function()
    C.fails(function() tok:encode("ab<|endoftext|>") end, "tok:encode", "<|endoftext|>", "byte offset 2",
      "allowed_special")
    C.fails(function() tok:encode("<|endoftext|>", {allowed_special = {}}) end, "tok:encode", "byte offset 0")
  end)
  it("is plain text with disallowed_special = {}, as tiktoken", function()
    local c = case("special token as text")
    assert.are.same(c.ids, tok:encode(c.text, {disallowed_special = {}, base = 0}))
    assert.is_true(#tok:encode("<|endoftext|>", {disallowed_special = {}}) > 1)
  end)
end)

describe("tok:encode errors", function()
  it("invalid UTF-8 names the byte offset", function()
    C.fails(function() tok:encode("ab\255c") end, "tok:encode", "invalid UTF-8", "byte offset 2")
    C.fails(function() tok:encode("x\230\151") end, "byte offset 1")          -- cut short
    C.fails(function() tok:encode("\192\175") end, "byte offset 0")           -- overlong '/'
    C.fails(function() tok:encode("ok \237\160\128") end, "byte offset 3")    -- a surrogate
    C.fails(function() tok:encode("\244\144\128\128") end, "byte offset 0")   -- past U+10FFFF
    C.fails(function() tok:encode("a\128") end, "byte offset 1")              -- a lone continuation byte
  end)
  it("bad arguments and options are named", function()
    C.fails(function() tok:encode(12) end, "tok:encode", "'text'", "expected a string", "got 12")
    C.fails(function() tok:encode("a", {base = 2}) end, "tok:encode", "'base'", "expected 0 or 1", "got 2")
    C.fails(function() tok:encode("a", {bases = 0}) end, "tok:encode", "unknown option 'bases'")
    C.fails(function() tok:encode("a", {allowed_special = {"<|x|>"}}) end, "tok:encode", "'allowed_special'")
    C.fails(function() tok:encode("a", 0) end, "tok:encode", "'opts'")
    C.fails(function() tok.encode("a") end, "tok:encode", "'self'")
  end)
end)

describe("tok:decode", function()
  it("gives the tokens' bytes: a prefix of an encoding may end inside a UTF-8 character", function()
    local ids = tok:encode("\230\151\165", {base = 0}) -- 日: more than one token
    assert.is_true(#ids > 1)
    local s = tok:decode({ids[1]}, {base = 0})
    assert.are.equal("\230\151\165", (s .. tok:decode({table.unpack(ids, 2)}, {base = 0})))
  end)
  it("an empty list is the empty string", function()
    assert.are.equal("", tok:decode({}))
  end)
  it("ids out of range or not integers are named with their index", function()
    C.fails(function() tok:decode({1, 0}) end, "tok:decode", "ids[2]", "1..50257", "got 0")
    C.fails(function() tok:decode({50258}) end, "ids[1]", "got 50258")
    C.fails(function() tok:decode({50257}, {base = 0}) end, "ids[1]", "0..50256")
    C.fails(function() tok:decode({1.5}) end, "ids[1]", "got 1.5")
    C.fails(function() tok:decode({"1"}) end, "ids[1]", "got string")
    C.fails(function() tok:decode("1") end, "tok:decode", "'ids'", "got string")
  end)
end)

describe("attn.tokenizer.gpt2(dir)", function()
  local dir = os.tmpname()
  os.remove(dir)
  setup(function() assert(os.execute("mkdir -p " .. dir)) end)
  teardown(function() os.execute("rm -rf " .. dir) end)
  local function write(name, text)
    local f = assert(io.open(dir .. "/" .. name, "wb"))
    f:write(text)
    f:close()
  end

  it("reads a folder's encoder.json and vocab.bpe", function()
    -- a toy vocabulary: the 256 byte tokens (GPT-2's byte alphabet), "ab", "abc"
    local parts = {}
    local n = 0
    for byte = 0, 255 do
      local printable = (byte >= 33 and byte <= 126) or (byte >= 161 and byte <= 172) or (byte >= 174)
      local cp = byte
      if not printable then cp = 256 + n; n = n + 1 end
      local ch = utf8.char(cp)
      if ch == '"' or ch == "\\" then ch = "\\" .. ch end
      parts[#parts + 1] = ('"%s": %d'):format(ch, byte)
    end
    parts[#parts + 1] = '"ab": 256'
    parts[#parts + 1] = '"abc": 257'
    write("encoder.json", "{" .. table.concat(parts, ", ") .. "}")
    write("vocab.bpe", "#version: 0.2\na b\nab c\n")
    local t = attn.tokenizer.gpt2(dir)
    assert.are.equal(258, t.n_vocab)
    assert.is_nil(t.eot)
    -- pieces "abab" and " abc": a+b first (rank 0), then ab+c
    assert.are.same({256, 256, 32, 257}, t:encode("abab abc", {base = 0}))
    assert.are.equal("abab abc", t:decode({256, 256, 32, 257}, {base = 0}))
    -- without an end-of-text token in the vocabulary the text is plain text, allowed or not
    assert.are.same(t:encode("<|endoftext|>", {base = 0}), t:encode("<|endoftext|>", {base = 0, allowed_special = "all"}))
    assert.are.equal(13, #t:encode("<|endoftext|>", {base = 0}))
    write("vocab.bpe", "#version: 0.2\na b\nab d\n")
    C.fails(function() attn.tokenizer.gpt2(dir) end, "attn.tokenizer.gpt2", dir .. "/vocab.bpe", "line 3",
      "not in the encoder")
  end)

  it("a missing or malformed file is an error naming the path", function()
    C.fails(function() attn.tokenizer.gpt2(dir .. "/nowhere") end, "attn.tokenizer.gpt2", dir .. "/nowhere/encoder.json")
    write("encoder.json", '{"a": 0,')
    C.fails(function() attn.tokenizer.gpt2(dir) end, "attn.tokenizer.gpt2", dir .. "/encoder.json", "byte offset")
    C.fails(function() attn.tokenizer.gpt2(42) end, "attn.tokenizer.gpt2", "'dir'", "got 42")
  end)
end)
