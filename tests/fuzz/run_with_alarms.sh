#!/bin/sh
# Replays what made coordination_service_fuzz stop connecting in CI: libFuzzer's
# -timeout alarm (SIGALRM, handler without SA_RESTART) interrupting the
# harness's blocking calls. Runs the fuzzer as run_fuzzer.sh does, for
# DEW_ALARM_SECONDS (default 5), while SIGALRM arrives every few
# milliseconds; any finding fails the test.
#
#   run_with_alarms.sh FUZZER WORK_DIR SEED_DIR [libFuzzer flags...]
set -eu
here=$(dirname "$0")
seconds=${DEW_ALARM_SECONDS:-5}
DEW_FUZZ_SECONDS=$seconds sh "$here/run_fuzzer.sh" "$@" &
runner=$!
# The runner execs timeout, which starts the fuzzer as its child. Before
# that exec the runner's children are its own commands (mkdir): the fuzzer
# is the child whose program is the fuzzer's (taking the first child, a
# mkdir once, sent no alarm at all). Alarms start once the fuzzer catches
# SIGALRM (libFuzzer installs its handler at start; before that, SIGALRM's
# default action would kill it).
program=$(readlink -f "$1")
fuzzer_child() {
  for child in $(pgrep -P "$runner" 2>/dev/null); do
    if [ "$(readlink "/proc/$child/exe" 2>/dev/null)" = "$program" ]; then
      echo "$child"
      return
    fi
  done
}
catches_alarm() {
  caught=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null)
  [ -n "$caught" ] && [ $((0x$caught & 0x2000)) -ne 0 ]
}
fuzzer=""
tries=0
while [ $tries -lt 3000 ] && kill -0 "$runner" 2>/dev/null; do
  [ -z "$fuzzer" ] && fuzzer=$(fuzzer_child)
  if [ -n "$fuzzer" ] && catches_alarm "$fuzzer"; then break; fi
  tries=$((tries + 1))
  sleep 0.01
done
# Never a default-action SIGALRM: that would kill the fuzzer, not test it.
if [ -n "$fuzzer" ] && ! catches_alarm "$fuzzer"; then fuzzer=""; fi
sent=0
while kill -0 "$runner" 2>/dev/null; do
  if [ -n "$fuzzer" ] && kill -ALRM "$fuzzer" 2>/dev/null; then sent=$((sent + 1)); fi
  sleep 0.003
done
status=0
wait "$runner" || status=$?
echo "run_with_alarms: $sent alarms sent to pid ${fuzzer:-none}; the fuzzer's exit status: $status"
if [ -z "$fuzzer" ] || [ "$sent" -lt 100 ]; then
  echo "run_with_alarms: too few alarms reached the fuzzer to replay the interruption" >&2
  exit 1
fi
exit "$status"
