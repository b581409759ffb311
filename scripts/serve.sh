#!/usr/bin/env bash
# serve.sh [MODEL.gguf] [strata serve options] — installs what is missing, builds, and serves.
# The build's progress is shown (the first build takes minutes on a small machine); its whole
# output goes to build/build.log, and its last lines are shown if it fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
mkdir -p "$root/build"
log=$root/build/build.log
echo "serve.sh: building strata in build/ ($(nproc) cores; the first build takes a few minutes, the log is $log)"
# Only the "[ NN%]" lines of the build, each percentage once: on a terminal over one line,
# elsewhere one line per 10%.
progress() {
  local last=-1 step=1 pct
  [ -t 1 ] || step=10
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    [[ $line =~ ^\[\ *([0-9]+)%\] ]] || continue
    pct=${BASH_REMATCH[1]}
    (( pct / step > last / step || (pct == 100 && last != 100) )) || continue
    last=$pct
    if [ -t 1 ]; then printf '\rserve.sh: build %3d%%' "$pct"; else echo "serve.sh: build $pct%"; fi
  done
  [ -t 1 ] && [ "$last" -ge 0 ] && echo
  return 0
}
: >"$log"
if ! "$root/scripts/build.sh" "$root/build" 2>&1 | progress; then
  echo "serve.sh: the build failed; its last lines (all of it: $log):" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
exec "$root/build/strata" serve "$@"
