#!/usr/bin/env bash
# The course's claims on the shapes of machine its readers have, not only on this one.
#
#   bash scripts/check_machine_shapes.sh                  every variant, over the whole suite
#   bash scripts/check_machine_shapes.sh --cheap          the cheap set of each variant (CI runs it)
#   bash scripts/check_machine_shapes.sh --only busy,avx2 [-- PYTEST ARGS]  (instead of the variants' tests)
#
# The variants (each one pytest run; the summary at the end gives each one's counts and time):
#   default      as test.sh runs it: fp32, oneDNN picks its kernels for this CPU
#   busy         the same with one core kept busy by another process (a laptop with a browser open,
#                a shared VM): a CPU hog started here, ended when the run ends
#   avx2         oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2): the kernels of a CPU without
#                AVX-512; batchlab then treats bf16 as a CPU without bf16 units does
#   avx512_bf16  oneDNN capped at AVX512_CORE_BF16: AVX-512 bf16 kernels without AMX tiles
#   bf16         every notebook with BATCHLAB_DTYPE=bfloat16 (the claims that depend on the dtype)
# A CPU's other kernels (AMX tiles, on Intel Xeons from Sapphire Rapids on) cannot be called up on
# a CPU without them: their claims are the dtype's claims (batchlab.model.divergence). A cap that
# leaves oneDNN the kernels it picks uncapped (AVX512_CORE_BF16 on a CPU with avx512_bf16 and no
# AMX, AVX2 on one without AVX-512) would repeat the main pass: that variant is skipped, saying so.
#
# --cheap runs busy, avx2, avx512_bf16 and bf16 over a few minutes' worth of tests: notebook 09
# (busy: the timing claims of a simulator calibrated in the run), the batched step, the dtypes and
# answers alone against batched (avx2, avx512_bf16), and notebooks 04 and 05 (bf16). With --cheap
# on two or more CPUs the capped variants' model tests, which time nothing, are the busy variant's
# load (pinned to one CPU), so they take no time of their own. Arguments after -- replace what
# every variant runs (tests, notebooks, -k ...).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "check_machine_shapes: no .venv; run bash scripts/setup.sh first" >&2; exit 2; }

ALL_VARIANTS=(default busy avx2 avx512_bf16 bf16)
variants=() cheap=0 extra=()
while (( $# )); do
  case "$1" in
    --cheap) cheap=1 ;;
    --only) shift; IFS=, read -r -a variants <<< "${1:-}" ;;
    --) shift; extra=("$@"); break ;;
    *) echo "check_machine_shapes: unknown argument '$1'; allowed: --cheap, --only V1,V2, -- PYTEST ARGS" >&2
       exit 2 ;;
  esac
  shift
done
# Without --only: every variant; with --cheap, all but default (test.sh's main pass is that one).
if (( ${#variants[@]} == 0 )); then
  variants=("${ALL_VARIANTS[@]}")
  (( cheap )) && variants=(busy avx2 avx512_bf16 bf16)
fi
for v in "${variants[@]}"; do
  [[ " ${ALL_VARIANTS[*]} " == *" $v "* ]] || {
    echo "check_machine_shapes: unknown variant '$v'; allowed: ${ALL_VARIANTS[*]}" >&2; exit 2; }
done

# What each variant runs: the whole suite (every notebook, for bf16), or its cheap set.
MODEL_TESTS=(tests/test_batched_step.py tests/test_bf16_step.py tests/test_divergence.py
             tests/test_cpu_dtype.py tests/test_generate.py)
targets() {  # $1: the variant
  if (( cheap )); then
    case "$1" in
      busy) echo notebooks/09_who_wins_at_low_traffic.ipynb ;;
      bf16) echo notebooks/04_continuous_batching.ipynb notebooks/05_memory_caps_the_batch.ipynb ;;
      *) echo "${MODEL_TESTS[@]}" ;;
    esac
  else
    case "$1" in
      bf16) echo notebooks/[0-9][0-9]_*.ipynb ;;
      *) echo tests notebooks ;;
    esac
  fi
}

# oneDNN's instruction set and the kernels it ran for one fp32 and one bf16 product, under the
# environment given (batchlab.model.cpu_kernels; a fresh process each, a few seconds).
kernels_under() {
  env "$@" "$PY" -c 'from batchlab.model.cpu_kernels import kernel_report as k; r = k()
print(r["isa"], r["fp32_kernel"], r["bf16_kernel"], *r["bf16_units"])' 2>/dev/null
}
uncapped=""

# A variant's environment.
variant_env() {  # $1: the variant
  env=(BATCHLAB_DTYPE=float32)
  case "$1" in
    avx2) env+=(ONEDNN_MAX_CPU_ISA=AVX2) ;;
    avx512_bf16) env+=(ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16) ;;
    bf16) env=(BATCHLAB_DTYPE=bfloat16) ;;
  esac
}
# A capped variant whose cap leaves oneDNN its uncapped kernels: says so, and succeeds (skip it).
same_kernels() {  # $1: the variant
  [[ "$1" == avx2 || "$1" == avx512_bf16 ]] || return 1
  [ -n "$uncapped" ] || uncapped=$(kernels_under)
  local capped
  capped=$(kernels_under "${env[@]}")
  [ -n "$capped" ] && [ "$capped" = "$uncapped" ] || return 1
  echo "== check_machine_shapes: $1 skipped: ${env[*]} leaves oneDNN the kernels it picks uncapped" \
       "on this CPU ($capped), so the main pass already ran them"
  printf '%-12s %-8s %5s s  %s\n' "$1" same 0 "the main pass's kernels: $capped" > "$results/$1"
}
# One variant's pytest run; its summary line goes to $results/VARIANT.
run_variant() {  # $1: the variant, $2: what runs beside it ("" or its description)
  local v=$1 load=$2 start log rc counts files
  # shellcheck disable=SC2207
  files=($(targets "$v"))
  (( ${#extra[@]} )) && files=("${extra[@]}")
  echo "== check_machine_shapes: $v (${env[*]}${load:+, $load}): pytest ${files[*]}"
  start=$(date +%s)
  log=$(mktemp)
  env "${env[@]}" BATCHLAB_EXECUTED_DIR= "$PY" -m pytest --nbval-lax -q -p no:cacheprovider \
      "${files[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  counts=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  printf '%-12s %-8s %5s s  %s\n' "$v" "$([ "$rc" = 0 ] && echo ok || echo FAILED)" \
         $(( $(date +%s) - start )) "${counts:-no result}" > "$results/$v"
  rm -f "$log"
  return "$rc"
}

# The busy variant's other core: a CPU hog for at most two hours, whatever happens to this script.
# With --cheap on two or more CPUs, the capped variants' model tests (which time nothing) are that
# load first, pinned to the last CPU with one torch thread, then the hog there: one core's worth of
# work either way, and the capped variants cost no time of their own. Their output is printed
# after the busy variant's.
hog="" load_done=""
stop_hog() {
  if [ -n "$load_done" ]; then        # the capped variants' runs end first
    while [ ! -e "$load_done" ] && kill -0 "$hog" 2>/dev/null; do sleep 1; done
  fi
  [ -n "$hog" ] && kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null; hog=""
}
trap 'load_done=""; stop_hog; rm -rf "$results"' EXIT
results=$(mktemp -d)
last_cpu=$("$PY" -c 'import os; print(max(os.sched_getaffinity(0)), len(os.sched_getaffinity(0)))' 2>/dev/null)
capped_as_load=()
if (( cheap )) && [[ " ${variants[*]} " == *" busy "* ]] && command -v taskset > /dev/null \
   && (( ${last_cpu#* } >= 2 )); then
  for v in avx2 avx512_bf16; do
    [[ " ${variants[*]} " == *" $v "* ]] && capped_as_load+=("$v")
  done
fi
status=0
for v in "${variants[@]}"; do
  [[ " ${capped_as_load[*]} " == *" $v "* ]] && continue       # run as the busy variant's load
  variant_env "$v"
  same_kernels "$v" && continue
  load=""
  if [ "$v" = busy ]; then
    if (( ${#capped_as_load[@]} )); then
      load_done="$results/load.done"
      ( taskset -cp "${last_cpu% *}" "$BASHPID" > /dev/null       # this and all it starts: one CPU
        for c in "${capped_as_load[@]}"; do
          variant_env "$c"
          same_kernels "$c" > "$results/$c.log" 2>&1 \
            || run_variant "$c" "pinned to one CPU, the busy variant's load" > "$results/$c.log" 2>&1
        done
        touch "$load_done"
        exec timeout 7200 "$PY" -c 'while True: pass' ) &
      load="the capped variants' model tests (${capped_as_load[*]}), then a CPU hog"
    else
      timeout 7200 "$PY" -c 'while True: pass' &
      load="a CPU hog"
    fi
    hog=$!
  fi
  run_variant "$v" "$load" || status=1
  stop_hog
  load_done=""
  [ "$v" = busy ] || continue
  for c in "${capped_as_load[@]}"; do
    cat "$results/$c.log" 2>/dev/null
    grep -qE "^$c +(ok|same) " "$results/$c" 2>/dev/null || status=1
  done
done
echo "== check_machine_shapes: summary"
for v in "${variants[@]}"; do cat "$results/$v" 2>/dev/null || echo "$v  FAILED  no result"; done
exit $status
