#!/bin/sh
# The own GEMM of two revisions, A/B in one process (scripts/gemm_ab.c):
#   scripts/gemm_ab.sh [--avx2] [--rounds N] REV_A [REV_B]
# REV_B defaults to the working tree. Each side's src/core/kernels_gemm_avx512.c
# (kernels_gemm_avx2.c with --avx2) is compiled with the Makefile's flags and
# its attn_sgemm_* renamed (objcopy), so both live in one program that times
# them call by call in turn at the training step's products, one thread, each
# against an FMA loop over the same flops. On a machine whose speed drifts
# between runs (a shared VM) this is the comparison to trust for a GEMM
# change; the last line says whether every output has the same bits.
set -eu
cd "$(dirname "$0")/.."
set_name=avx512 flags="-mavx512f -mfma" rounds=25
while [ $# -gt 0 ]; do
  case "$1" in
    --avx2) set_name=avx2 flags="-mavx2 -mfma"; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    -*) echo "gemm_ab.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: scripts/gemm_ab.sh [--avx2] [--rounds N] REV_A [REV_B]" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cflags="-O2 -std=gnu11 -fPIC -fopenmp -ffp-contract=off -fvisibility=hidden"
# side NAME REV: that revision's src/core (REV "" = the working tree) -> $tmp/NAME.o exporting gemm_NAME alone
side() {
  mkdir -p "$tmp/$1"
  if [ -n "$2" ]; then git archive "$2" src/core | tar -x -C "$tmp/$1"; else cp -r src "$tmp/$1/"; fi
  cc $cflags $flags -c "$tmp/$1/src/core/kernels_gemm_$set_name.c" -o "$tmp/$1.raw.o"
  objcopy -G "gemm_$1" --redefine-sym "attn_sgemm_$set_name=gemm_$1" "$tmp/$1.raw.o" "$tmp/$1.o"
}
side a "$1"
side b "${2:-}"
cc -O2 -fopenmp -o "$tmp/gemm_ab" scripts/gemm_ab.c "$tmp/a.o" "$tmp/b.o" -lm
echo "a: $1 (attn_sgemm_$set_name), b: ${2:-the working tree}"
"$tmp/gemm_ab" "$rounds"
