// libFuzzer entry point for the GGUF reader: every input must parse or throw sparrow::Error; a parsed file
// must have its tensors inside the input and disjoint, and must survive a write-back and re-read.
//
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSPARROW_FUZZ=ON && ninja -C build-fuzz gguf_fuzzer
//   mkdir -p /tmp/gguf-corpus && ./build-fuzz/fuzz/gguf_fuzzer -dict=fuzz/gguf.dict -max_len=4096 /tmp/gguf-corpus
//
// The deterministic fuzzer that runs in CTest is tests/gguf_fuzz_test.cpp; this one is for long runs by hand.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace {

[[noreturn]] void fail(const char *what) {
    std::fprintf(stderr, "gguf_fuzzer: invariant broken: %s\n", what);
    __builtin_trap();  // libFuzzer reports the crash and saves the input that caused it
}

uint64_t touch(const sparrow::gguf::Value &v) {
    if (const auto *a = std::get_if<sparrow::gguf::Array>(&v.data)) {
        uint64_t h = a->items.size();
        for (const auto &item : a->items) {
            if (item.type != a->type) fail("array element of another type");
            h += touch(item);
        }
        return h;
    }
    if (const auto *s = std::get_if<std::string>(&v.data)) {
        uint64_t h = 0;
        for (char c : *s) h += static_cast<unsigned char>(c);
        return h;
    }
    return v.to_display_string().size();
}

// A GGUF v3 header with the given tensor and key counts and nothing after it.
std::vector<uint8_t> header(uint64_t n_tensors, uint64_t n_kv) {
    std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    for (const uint64_t v : {n_tensors, n_kv}) {
        for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    return b;
}

}  // namespace

// For fuzz/replay_main.cpp: empty and truncated headers, absurd counts, a key cut short.
std::vector<std::vector<uint8_t>> fuzz_builtin_inputs() {
    std::vector<std::vector<uint8_t>> inputs = {{},           {'G', 'G', 'U', 'F'}, header(0, 0),
                                                header(1, 0), header(0, 1),         header(~uint64_t(0), ~uint64_t(0))};
    std::vector<uint8_t> truncated_key = header(0, 1);
    truncated_key.insert(truncated_key.end(), {5, 0, 0, 0, 0, 0, 0, 0, 'a', 'b'});  // key length 5, 2 bytes of it
    inputs.push_back(truncated_key);
    return inputs;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace sparrow::gguf;
    try {
        const File f = File::parse(std::span<const uint8_t>(data, size), "<fuzz>");
        volatile uint64_t sink = 0;
        for (const auto &kv : f.metadata()) sink = sink + touch(kv.second);
        std::vector<const TensorInfo *> by_offset;
        for (const auto &t : f.tensors()) {
            const auto pos = static_cast<uint64_t>(t.data - data);
            if (pos > size || static_cast<uint64_t>(t.n_bytes) > size - pos) fail("tensor outside the input");
            for (int64_t i = 0; i < t.n_bytes; ++i) sink = sink + t.data[i];
            by_offset.push_back(&t);
        }
        std::sort(by_offset.begin(), by_offset.end(), [](auto *a, auto *b) { return a->offset < b->offset; });
        for (size_t i = 1; i < by_offset.size(); ++i) {
            if (by_offset[i - 1]->offset + static_cast<uint64_t>(by_offset[i - 1]->n_bytes) > by_offset[i]->offset) {
                fail("overlapping tensors");
            }
        }
        const std::vector<uint8_t> again = Writer::from_file(f).to_bytes();
        const File g = File::parse(again, "<rewritten>");
        if (g.metadata().size() != f.metadata().size() || g.tensors().size() != f.tensors().size())
            fail("write-back differs");
        if (Writer::from_file(g).to_bytes() != again) fail("write-back is not a fixed point");
    } catch (const sparrow::Error &) {
        // A clean rejection.
    }
    return 0;
}
