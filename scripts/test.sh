#!/usr/bin/env bash
# Builds everything and runs the whole test suite: a Release build with warnings as errors, then the
# same suite under AddressSanitizer + UndefinedBehaviorSanitizer. Tests needing ../shared/data skip
# (with a message) when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

echo "== formatting (clang-format)"
if command -v clang-format >/dev/null; then
    # unicode_tables.cpp is generated (scripts/gen_unicode_tables.py) and left as generated.
    git ls-files '*.cpp' '*.h' | grep -v 'src/runtime/unicode_tables.cpp' | xargs clang-format --dry-run --Werror
else
    echo "clang-format not installed: skipping the format check"
fi

echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARROW_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== sanitizer build (ASan + UBSan) + tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARROW_SANITIZE=ON -DSPARROW_WERROR=ON
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE slow
