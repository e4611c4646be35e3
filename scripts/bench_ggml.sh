#!/bin/sh
# ggml's CPU flash attention on the attention cases of scripts/bench.lua, same
# JSON fields (kernel "ggml", plus ggml_commit and max_abs_error).
#
#   scripts/bench_ggml.sh [--cases LIST] [--threads N] [--reps N] GGML_DIR
#
# GGML_DIR is a source checkout of ggml-org/ggml (`git clone` of the ggml
# repository). The script builds it CPU-only, Release, with its default native
# CPU flags, into build/ggml/ of this repository, links scripts/bench_ggml.c
# against it, and runs each case in its own process (so peak_rss_mb is that
# case's). LIST is comma-separated from A, A_causal, B, B_causal, C_causal
# (default: all); threads default to OMP_NUM_THREADS or the number of cores.
# Needs cmake and a C/C++ compiler. Not part of `make test`.
set -u

usage() {
    echo "usage: scripts/bench_ggml.sh [--cases LIST] [--threads N] [--reps N] GGML_DIR" >&2
    echo "  GGML_DIR: a ggml source checkout (git clone of ggml-org/ggml)" >&2
    echo "  LIST: comma-separated from A, A_causal, B, B_causal, C_causal (default: all)" >&2
    [ $# -eq 0 ] || echo "bench_ggml.sh: $*" >&2
    exit 2
}

cases="A,A_causal,B,B_causal,C_causal"
threads="${OMP_NUM_THREADS:-}"
reps=3
ggml_dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cases|--threads|--reps)
            [ $# -ge 2 ] || usage "$1 needs a value"
            case "$1" in
                --cases) cases="$2" ;;
                --threads) threads="$2" ;;
                --reps) reps="$2" ;;
            esac
            shift 2 ;;
        -h|--help) usage ;;
        -*) usage "unknown option '$1'" ;;
        *)
            [ -z "$ggml_dir" ] || usage "one GGML_DIR expected, got '$ggml_dir' and '$1'"
            ggml_dir="$1"
            shift ;;
    esac
done

[ -n "$ggml_dir" ] || usage "GGML_DIR is missing"
[ -d "$ggml_dir" ] || usage "GGML_DIR '$ggml_dir' is not a directory"
if [ ! -f "$ggml_dir/include/ggml.h" ] || [ ! -f "$ggml_dir/CMakeLists.txt" ] || [ ! -d "$ggml_dir/src/ggml-cpu" ]; then
    usage "'$ggml_dir' is not a ggml source checkout (no include/ggml.h, CMakeLists.txt and src/ggml-cpu/)"
fi
grep -q "ggml_flash_attn_ext_set_prec" "$ggml_dir/include/ggml.h" ||
    usage "the ggml in '$ggml_dir' has no ggml_flash_attn_ext_set_prec (too old)"
[ "$cases" = "all" ] && cases="A,A_causal,B,B_causal,C_causal"
for name in $(echo "$cases" | tr ',' ' '); do
    case "$name" in
        A|A_causal|B|B_causal|C_causal) ;;
        *) usage "unknown case '$name'" ;;
    esac
done
case "$reps" in ''|*[!0-9]*|0) usage "--reps expects a positive integer, got '$reps'" ;; esac
[ -n "$threads" ] || threads=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
case "$threads" in ''|*[!0-9]*|0) usage "--threads expects a positive integer, got '$threads'" ;; esac

command -v cmake >/dev/null 2>&1 ||
    { echo "bench_ggml.sh: cmake is not installed (Debian: apt-get install cmake)" >&2; exit 2; }
cxx_found=""
for compiler in "${CXX:-}" c++ g++ clang++; do
    [ -n "$compiler" ] && command -v "$compiler" >/dev/null 2>&1 && { cxx_found="$compiler"; break; }
done
[ -n "$cxx_found" ] ||
    { echo "bench_ggml.sh: no C++ compiler found (ggml needs one; Debian: apt-get install g++)" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
ggml_dir=$(cd "$ggml_dir" && pwd)
commit=$(git -C "$ggml_dir" rev-parse HEAD 2>/dev/null || echo unknown)
build="$root/build/ggml"
mkdir -p "$build/wrapper" || exit 1

# a wrapper project: ggml as a subproject (its defaults: CPU backend only,
# GGML_NATIVE on), and the timing program linked against it
cat >"$build/wrapper/CMakeLists.txt.new" <<EOF
cmake_minimum_required(VERSION 3.14)
project(attn_bench_ggml C CXX)
add_subdirectory("$ggml_dir" ggml)
add_executable(bench_ggml "$root/scripts/bench_ggml.c")
target_link_libraries(bench_ggml PRIVATE ggml m)
EOF
# rewrite only when it changed, so a rebuild of the same checkout is incremental
if cmp -s "$build/wrapper/CMakeLists.txt.new" "$build/wrapper/CMakeLists.txt"; then
    rm -f "$build/wrapper/CMakeLists.txt.new"
else
    mv "$build/wrapper/CMakeLists.txt.new" "$build/wrapper/CMakeLists.txt"
    rm -rf "$build/out"
fi

log="$build/build.log"
echo "bench_ggml.sh: building ggml $commit in $build/out (log: $log)" >&2
if ! { cmake -S "$build/wrapper" -B "$build/out" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx_found" \
           -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON &&
       cmake --build "$build/out" --target bench_ggml -j "$threads"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "bench_ggml.sh: building ggml failed (full log: $log)" >&2
    exit 1
fi

status=0
for name in $(echo "$cases" | tr ',' ' '); do
    "$build/out/bench_ggml" "$name" "$threads" "$reps" "$commit" || status=1
done
exit $status
