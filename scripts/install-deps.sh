#!/usr/bin/env bash
# Installs the Debian 12 packages sparrow needs to build and test. Idempotent: does nothing when they are
# all present already (so no network is needed on a prepared machine).
set -euo pipefail
packages=(cmake ninja-build g++ clang-format libgtest-dev libbenchmark-dev libcli11-dev libcpp-httplib-dev nlohmann-json3-dev pkg-config python3
          python3-numpy python3-jsonschema python3-jinja2)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
