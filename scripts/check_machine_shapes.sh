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
# answers alone against batched (avx2, avx512_bf16), and notebooks 04 and 05 (bf16). Arguments
# after -- replace what every variant runs (tests, notebooks, -k ...).
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

hog=""
stop_hog() { [ -n "$hog" ] && kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null; hog=""; }
trap stop_hog EXIT
summary=()
status=0
for v in "${variants[@]}"; do
  # shellcheck disable=SC2207
  files=($(targets "$v"))
  (( ${#extra[@]} )) && files=("${extra[@]}")
  env=(BATCHLAB_DTYPE=float32)
  case "$v" in
    avx2) env+=(ONEDNN_MAX_CPU_ISA=AVX2) ;;
    avx512_bf16) env+=(ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16) ;;
    bf16) env=(BATCHLAB_DTYPE=bfloat16) ;;
  esac
  if [[ "$v" == avx2 || "$v" == avx512_bf16 ]]; then
    [ -n "$uncapped" ] || uncapped=$(kernels_under)
    capped=$(kernels_under "${env[@]}")
    if [ -n "$capped" ] && [ "$capped" = "$uncapped" ]; then
      echo "== check_machine_shapes: $v skipped: ${env[*]} leaves oneDNN the kernels it picks uncapped" \
           "on this CPU ($capped), so the main pass already ran them"
      summary+=("$(printf '%-12s %-8s %5s s  %s' "$v" same 0 "the main pass's kernels: $capped")")
      continue
    fi
  fi
  if [ "$v" = busy ]; then
    # One core's worth of other work, for at most two hours, whatever happens to this script.
    timeout 7200 "$PY" -c 'while True: pass' &
    hog=$!
  fi
  echo "== check_machine_shapes: $v (${env[*]}${hog:+, a CPU hog}): pytest ${files[*]}"
  start=$(date +%s)
  log=$(mktemp)
  # The cheap set's model tests time nothing (tests/conftest.py: PARALLEL_MODULES): two at a time.
  workers=()
  (( cheap )) && (( ${#extra[@]} == 0 )) && [[ "$v" == avx2 || "$v" == avx512_bf16 ]] && \
      workers=(-n "${BATCHLAB_TEST_WORKERS:-2}")
  env "${env[@]}" BATCHLAB_EXECUTED_DIR= "$PY" -m pytest --nbval-lax -q -p no:cacheprovider "${workers[@]}" \
      "${files[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  stop_hog
  counts=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  summary+=("$(printf '%-12s %-8s %5s s  %s' "$v" "$([ "$rc" = 0 ] && echo ok || echo FAILED)" \
                $(( $(date +%s) - start )) "${counts:-no result}")")
  rm -f "$log"
  (( rc == 0 )) || status=1
done
echo "== check_machine_shapes: summary"
printf '%s\n' "${summary[@]}"
exit $status
