#!/bin/sh
# llm.c's CPU training step (karpathy/llm.c train_gpt2.c) at the size of
# scripts/bench.lua's train_gpt case: one JSON line with bench.lua's fields
# (case "train_gpt", kernel "llm.c", ms best of N steps after a warm-up,
# gflops on bench.lua's flop count, tokens_per_s, peak_rss_mb), plus cflags,
# llmc_commit and the last step's loss.
#
#   scripts/bench_llmc.sh [--threads N] [--reps N] LLMC_DIR
#
# LLMC_DIR is a source checkout of karpathy/llm.c (never downloaded here). Its
# train_gpt2.c is compiled unchanged, with -DTESTING (its main left out),
# OpenMP, and -O3 -march=native unless LLMC_CFLAGS says otherwise (llm.c's
# own Makefile uses -Ofast), inside scripts/bench_llmc_driver.c, which writes
# a random-weight checkpoint in llm.c's format (vocab 256, context 128, 128
# wide, 4 heads, 4 layers) and times forward + backward + AdamW at batch 16.
# The binary goes to build/llmc/ of this repository. Threads default to
# OMP_NUM_THREADS or the number of cores. Not part of `make test`.
set -u

usage() {
    echo "usage: scripts/bench_llmc.sh [--threads N] [--reps N] LLMC_DIR" >&2
    echo "  LLMC_DIR: a karpathy/llm.c source checkout" >&2
    echo "  LLMC_CFLAGS (environment): optimisation flags, default -O3 -march=native" >&2
    [ $# -eq 0 ] || echo "bench_llmc.sh: $*" >&2
    exit 2
}

threads="${OMP_NUM_THREADS:-}"
reps=3
llmc_dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --threads|--reps)
            [ $# -ge 2 ] || usage "$1 needs a value"
            case "$1" in
                --threads) threads="$2" ;;
                --reps) reps="$2" ;;
            esac
            shift 2 ;;
        -h|--help) usage ;;
        -*) usage "unknown option '$1'" ;;
        *)
            [ -z "$llmc_dir" ] || usage "one LLMC_DIR expected, got '$llmc_dir' and '$1'"
            llmc_dir="$1"
            shift ;;
    esac
done

[ -n "$llmc_dir" ] || usage "LLMC_DIR is missing"
[ -d "$llmc_dir" ] || usage "LLMC_DIR '$llmc_dir' is not a directory"
if [ ! -f "$llmc_dir/train_gpt2.c" ] || [ ! -f "$llmc_dir/llmc/utils.h" ]; then
    usage "'$llmc_dir' is not an llm.c source checkout (no train_gpt2.c and llmc/utils.h)"
fi
grep -q "#ifndef TESTING" "$llmc_dir/train_gpt2.c" ||
    usage "the train_gpt2.c in '$llmc_dir' has no #ifndef TESTING around its main"
case "$reps" in ''|*[!0-9]*|0) usage "--reps expects a positive integer, got '$reps'" ;; esac
[ -n "$threads" ] || threads=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
case "$threads" in ''|*[!0-9]*|0) usage "--threads expects a positive integer, got '$threads'" ;; esac

cc="${CC:-cc}"
command -v "$cc" >/dev/null 2>&1 || { echo "bench_llmc.sh: no C compiler ('$cc')" >&2; exit 2; }
cflags="${LLMC_CFLAGS:--O3 -march=native}"
root=$(cd "$(dirname "$0")/.." && pwd)
llmc_dir=$(cd "$llmc_dir" && pwd)
commit=$(git -C "$llmc_dir" rev-parse HEAD 2>/dev/null || echo unknown)
build="$root/build/llmc"
mkdir -p "$build" || exit 1

log="$build/build.log"
echo "bench_llmc.sh: building llm.c $commit ($cflags) in $build (log: $log)" >&2
# shellcheck disable=SC2086 # cflags is a list of flags
if ! "$cc" $cflags -fopenmp -DOMP -w -I"$llmc_dir" -o "$build/bench_llmc" "$root/scripts/bench_llmc_driver.c" -lm \
        >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "bench_llmc.sh: building failed (full log: $log)" >&2
    exit 1
fi

OMP_NUM_THREADS="$threads" "$build/bench_llmc" "$reps" "$commit" "$cflags"
