#!/usr/bin/env bash
# Builds sparrow and runs the main job: generate text from stories260K (../shared/data) when present,
# else from a tiny model that `sparrow make-model` writes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
model=../shared/data/models/stories260K.gguf
if [ ! -f "$model" ]; then
    model=build/tiny-llama.gguf
    echo "../shared/data is absent: generating $model"
    build/sparrow make-model --arch llama -o "$model"
fi
build/sparrow run -m "$model" -p "Once upon a time" -n 64 "$@"
