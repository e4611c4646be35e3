#!/bin/sh
# The portable build on arm64, from an x86-64 Debian 12 machine: cross-build
# with Debian's aarch64 gcc (the default Makefile: scalar kernels only, no -m
# flag), then run the C checks and the busted suite (all but install_spec, or
# the spec files given) under qemu-user, against Debian's arm64 liblua5.4 and
# OpenBLAS.
#   scripts/check-arm64.sh [--install] [spec files...]
# --install (as root): dpkg --add-architecture arm64 and apt-get the packages.
# Not part of `make test` or CI: it adds a foreign architecture to the machine.
#
# Debian's lua-term is not co-installable across architectures (installing
# lua-term:arm64 removes lua-busted), so its arm64 module is unpacked into the
# work directory instead, as is the small lua5.4 stand-in the emulated suite
# runs under (lua5.4:arm64 would replace the host's interpreter).
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
work="${ARM64_WORK:-/tmp/attn-arm64}"
install=0
if [ "$1" = "--install" ]; then install=1; shift; fi

pkgs="gcc-aarch64-linux-gnu qemu-user liblua5.4-dev:arm64 libopenblas-openmp-dev:arm64 libgomp1:arm64 lua-filesystem:arm64 lua-system:arm64"
if [ "$install" = 1 ]; then
  dpkg --add-architecture arm64
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs lua-busted >/dev/null
fi
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "check-arm64: missing Debian packages:$missing (run as root with --install)" >&2
  exit 2
fi

mkdir -p "$work/bin" "$work/root"
if [ ! -f "$work/root/usr/lib/aarch64-linux-gnu/lua/5.4/term/core.so" ]; then
  (cd "$work" && apt-get download lua-term:arm64 >/dev/null 2>&1 && dpkg-deb -x lua-term_*_arm64.deb root)
fi
# lua5.4 for arm64: script [args] or -e chunk ..., with a traceback on error
cat >"$work/minilua.c" <<'EOF'
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>
static int traceback(lua_State *L) {
  const char *m = lua_tostring(L, 1);
  luaL_traceback(L, L, m ? m : "(error object)", 1);
  return 1;
}
static int call(lua_State *L, int nargs) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int st = lua_pcall(L, nargs, 0, base);
  if (st != LUA_OK) fprintf(stderr, "lua5.4: %s\n", lua_tostring(L, -1));
  return st;
}
int main(int argc, char **argv) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  int i = 1;
  for (; i + 1 < argc && strcmp(argv[i], "-e") == 0; i += 2) {
    /* lua.c's chunk name: a traceback must not echo the chunk's text */
    const char *chunk = argv[i + 1];
    if (luaL_loadbuffer(L, chunk, strlen(chunk), "=(command line)") != LUA_OK || call(L, 0) != LUA_OK) return 1;
  }
  if (i >= argc) return 0;
  lua_createtable(L, argc, 0);
  for (int j = 0; j < argc; j++) { lua_pushstring(L, argv[j]); lua_rawseti(L, -2, j - i); }
  lua_setglobal(L, "arg");
  if (luaL_loadfile(L, argv[i]) != LUA_OK) { fprintf(stderr, "lua5.4: %s\n", lua_tostring(L, -1)); return 1; }
  for (int j = i + 1; j < argc; j++) lua_pushstring(L, argv[j]);
  int st = call(L, argc - i - 1);
  lua_close(L);
  return st == LUA_OK ? 0 : 1;
}
EOF
aarch64-linux-gnu-gcc -O2 -I/usr/include/lua5.4 "$work/minilua.c" -o "$work/minilua" -llua5.4
cat >"$work/bin/lua5.4" <<EOF
#!/bin/sh
LUA_CPATH="\${LUA_CPATH:-;;};$work/root/usr/lib/aarch64-linux-gnu/lua/5.4/?.so"
export LUA_CPATH
exec qemu-aarch64 -E LD_LIBRARY_PATH=$work/root/usr/lib/aarch64-linux-gnu $work/minilua "\$@"
EOF
chmod +x "$work/bin/lua5.4"

# the build: a copy of the tree (busted's config reads build/), the Makefile's defaults
rm -rf "$work/tree"
mkdir -p "$work/tree"
(cd "$here" && tar cf - --exclude=./build --exclude=./build-* --exclude=./.git .) | (cd "$work/tree" && tar xf -)
cd "$work/tree"
PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig make -s CC=aarch64-linux-gnu-gcc all build/core_test
echo "check-arm64: built $(file -b build/attn/core.so | cut -d, -f1-2)"
qemu-aarch64 build/core_test
PATH="$work/bin:$PATH" scripts/attn-lua -e 'local i = require("attn").cpu_info(); print("check-arm64: kernel " .. i.kernel .. ", OpenBLAS " .. i.openblas_core)'
# spec/install_spec.lua runs `make` in the tree with the host's compiler, which
# would replace the arm64 build under the other specs' children: left out
if [ $# -eq 0 ]; then set -- $(ls spec/*_spec.lua | grep -v '^spec/install_spec.lua$'); fi
# specs that compile a C host of their own (rng_states_spec) build it for arm64 and run it under qemu
PATH="$work/bin:$PATH" CC=aarch64-linux-gnu-gcc PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig \
  ATTN_SPEC_RUN="qemu-aarch64 -E LD_LIBRARY_PATH=$work/root/usr/lib/aarch64-linux-gnu" scripts/run-specs "$@"
