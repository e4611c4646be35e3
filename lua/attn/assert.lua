-- `require "attn.assert"` (the public name, api.md): the busted assertions of
-- attn.tools.assert, which live with the other tooling.
return require "attn.tools.assert"
