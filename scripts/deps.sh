#!/usr/bin/env bash
# deps.sh — install the Debian 12 packages strata builds with, only those missing.
set -euo pipefail
pkgs="build-essential cmake pkg-config libnng-dev libmsgpack-dev check libsubunit-dev
      libmicrohttpd-dev libjansson-dev libpcre2-dev libxxhash-dev clang libclang-rt-14-dev"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps: installing$missing"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
# Optional: the Windows shared-memory shim's test (scripts/wine-test) cross-builds with mingw-w64
# and runs under Wine. Without them that one stage is skipped; a failed install is not fatal.
opt=""
for p in gcc-mingw-w64-x86-64 wine64; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || opt="$opt $p"
done
if [ -n "$opt" ]; then
  echo "deps: installing (optional)$opt"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $opt >/dev/null ||
    echo "deps: could not install$opt: the Windows shim's test will be skipped"
fi
# The browser test of the web pages (launcher/web_test.c) drives Debian's chromium; without it
# that test skips. Its recommends (printing, desktop integration) are not needed headless.
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "ok installed"; then
  echo "deps: installing chromium (the web pages' browser test)"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null ||
    echo "deps: chromium could not be installed: the browser test will skip"
fi
