#!/usr/bin/env bash
# serve.sh [MODEL.gguf] [strata serve options] — installs what is missing, builds, and serves.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh" "$root/build" >/dev/null
exec "$root/build/strata" serve "$@"
