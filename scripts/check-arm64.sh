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
# work directory instead, as is Debian's lua5.4 for arm64 that the emulated
# suite runs under (installing lua5.4:arm64 would replace the host's).
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
# Debian's own arm64 interpreter and the libraries it needs, unpacked (a small
# C stand-in built here crashed under qemu once busted had loaded some 40 spec
# files; Debian's lua5.4 loads them all)
for pkg in lua-term lua5.4 libreadline8 libtinfo6; do
  if ! ls "$work"/${pkg}_*_arm64.deb >/dev/null 2>&1; then
    (cd "$work" && apt-get download $pkg:arm64 >/dev/null 2>&1) || { echo "check-arm64: cannot download $pkg:arm64" >&2; exit 2; }
  fi
  dpkg-deb -x "$work"/${pkg}_*_arm64.deb "$work/root"
done
cat >"$work/bin/lua5.4" <<EOF
#!/bin/sh
LUA_CPATH="\${LUA_CPATH:-;;};$work/root/usr/lib/aarch64-linux-gnu/lua/5.4/?.so"
export LUA_CPATH
exec qemu-aarch64 -E LD_LIBRARY_PATH=$work/root/usr/lib/aarch64-linux-gnu:$work/root/lib/aarch64-linux-gnu $work/root/usr/bin/lua5.4 "\$@"
EOF
chmod +x "$work/bin/lua5.4"

# the build: a copy of the tree (busted's config reads build/), the Makefile's defaults
rm -rf "$work/tree"
mkdir -p "$work/tree"
(cd "$here" && tar cf - --exclude=./build --exclude=./build-* --exclude=./.git --exclude=./.devbundle .) | (cd "$work/tree" && tar xf -)
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
