#!/usr/bin/env bash
# Install what Capuchin needs to build and test, with apt-get (Debian 12).
# A no-op when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsqlite3-dev
  clang libclang-rt-14-dev   # libFuzzer and the sanitizer runtimes
  sqlite3 procps             # tests inspect the database and processes
  python3                    # test_query parses the JSON, CSV and SVG output
  python3-dev python3-torch  # the PyTorch adapter (python/) and its tests
  chromium                   # the timeline SVG test renders it headless
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
