-- attn as a rock, built by the project's Makefile (offline):
--   luarocks --lua-version 5.4 make                 (system tree)
--   luarocks --lua-version 5.4 make --local         (~/.luarocks)
--   luarocks --lua-version 5.4 make --tree /tmp/t   (any tree)
-- The system needs liblua5.4-dev and libopenblas-openmp-dev (Debian 12), and
-- libopenmpi-dev for attn.dist (without it the rest builds).
rockspec_format = "3.0"
package = "attn"
version = "dev-1"
source = {
  url = "git+file://.",
}
description = {
  summary = "Attention mechanisms for Lua 5.4, reproducing PyTorch numbers",
  detailed = [[
attn is a Lua 5.4 module backed by a C core (float32 tensors, OpenBLAS,
OpenMP): tensors, scaled dot-product and multi-head attention, nn modules,
heatmaps, NumPy .npy I/O and busted helpers.]],
  license = "MIT",
  labels = { "attention", "tensor", "neural-network" },
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
supported_platforms = { "linux" }
build = {
  type = "make",
  build_target = "all",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LUA_INCDIR = "$(LUA_INCDIR)",
  },
  install_target = "install",
  install_variables = {
    INST_LIBDIR = "$(LIBDIR)",
    INST_LUADIR = "$(LUADIR)",
    -- the attn-lua and attn-busted launchers go to the rock's bin, not $(PREFIX)/bin
    INST_BINDIR = "$(BINDIR)",
  },
  copy_directories = {},
}
