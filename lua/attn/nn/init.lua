--- attn.nn: the module classes (PyTorch's torch.nn for this project).
-- A class in lua/attn/nn/NAME.lua is found as attn.nn.NAME on first use: new
-- classes need no entry here (see the pattern at the top of Module.lua).
-- Loaded eagerly: Module, ModuleList, Linear, Dropout.
-- @module attn.nn
local nn = {}

nn.Module = require "attn.nn.Module"
nn.ModuleList = nn.Module.ModuleList
nn.Linear = require "attn.nn.Linear"
nn.Dropout = require "attn.nn.Dropout"

-- Classes whose file is not NAME.lua: a case-insensitive filesystem cannot
-- hold both the book's MultiHeadAttention.lua and torch's MultiheadAttention.lua.
-- (attn.nn.TorchMultiheadAttention, the file's name, is the same class.)
nn._files = { MultiheadAttention = "TorchMultiheadAttention" }

-- attn.nn.NAME loads attn/nn/NAME.lua (or the file _files names) when that
-- file exists (errors in it are raised)
setmetatable(nn, {
  __index = function(t, name)
    if type(name) ~= "string" or not name:match("^[%a_][%w_]*$") then return nil end
    local file = rawget(t, "_files")[name] or name
    if not package.searchpath("attn.nn." .. file, package.path) then return nil end
    local cls = require("attn.nn." .. file)
    rawset(t, name, cls)
    return cls
  end,
})

return nn
