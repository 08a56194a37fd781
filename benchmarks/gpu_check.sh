#!/usr/bin/env bash
# The prepared GPU check (about 10 minutes on one CUDA GPU), or --dry-run: the same script on the CPU on
# tiny shapes (seconds; CI runs it). See benchmarks/gpu_check.py for what it measures.
#
#   benchmarks/gpu_check.sh [--dry-run] [--out DIR]
#
# Needs a python with torch, transformers, accelerate and pyarrow (PYTHON=..., default python3); not ray,
# optuna, polars, hydra-core or gguf. Prints the report and writes DIR/gpu_check.txt (what it printed),
# DIR/gpu_check.json (every figure) and DIR/machine.txt; DIR is --out, else $OUT, else ./gpu_check_out.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --dry-run) args+=("$1"); shift ;;
    *) echo "error: $1: unknown argument (allowed: --dry-run, --out DIR)" >&2; exit 2 ;;
  esac
done
out="${out:-${OUT:-$PWD/gpu_check_out}}"
mkdir -p "$out"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"
{
  date -u
  uptime || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>/dev/null || true
  (cd "$root" && git rev-parse HEAD 2>/dev/null) || true
} > "$out/machine.txt"
"$py" "$here/gpu_check.py" --out "$out" ${args[@]+"${args[@]}"} 2>&1 | tee "$out/gpu_check.txt"
