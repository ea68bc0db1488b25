#!/bin/sh
# Runs a libFuzzer target for a bounded time without touching the source tree.
#
#   run_fuzzer.sh FUZZER WORK_DIR SEED_DIR [libFuzzer flags...]
#
# libFuzzer writes the inputs it finds into the FIRST corpus directory it is
# given, so that one is WORK_DIR/corpus (in the build tree, kept between runs
# so coverage accumulates); SEED_DIR (the checked-in seeds) is only read.
# Crash, timeout and leak inputs land in WORK_DIR/artifacts/.
# DEW_FUZZ_SECONDS overrides the fuzzing time (default 30).
set -eu

if [ $# -lt 3 ]; then
  echo "usage: $0 FUZZER WORK_DIR SEED_DIR [libFuzzer flags...]" >&2
  exit 2
fi
fuzzer=$1
work=$2
seeds=$3
shift 3

seconds=${DEW_FUZZ_SECONDS:-30}
case $seconds in
  ''|*[!0-9]*)
    echo "$0: DEW_FUZZ_SECONDS='$seconds' is not allowed; allowed: a whole number of seconds" >&2
    exit 2
    ;;
esac

mkdir -p "$work/corpus" "$work/artifacts"

# UBSan findings are fatal (and so become libFuzzer crashes with an artifact).
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

# libFuzzer stops itself after -max_total_time; the outer limit only guards
# against a hang outside of a single input (which -timeout catches).
# libFuzzer's own code for a finding is 77, which meson reads as "skipped":
# every finding must fail the test instead.
exec timeout --kill-after=10 $((seconds + 120)) \
  "$fuzzer" "$work/corpus" "$seeds" \
  -max_total_time="$seconds" \
  -artifact_prefix="$work/artifacts/" \
  -error_exitcode=1 -timeout_exitcode=1 \
  "$@"
