// A main for the GGUF fuzzer's entry point without libFuzzer: runs LLVMFuzzerTestOneInput on each file named on the
// command line (a crash input libFuzzer saved, replayed with GCC's sanitizers), or with no arguments on a few built-in
// inputs (CTest: keeps the fuzzer's source list compiling and linking in every build).
//
//   ./build/tests/gguf_fuzzer_replay crash-1234abcd
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace {

// A GGUF v3 header with the given tensor and key counts and nothing after it.
std::vector<uint8_t> header(uint64_t n_tensors, uint64_t n_kv) {
    std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    for (const uint64_t v : {n_tensors, n_kv}) {
        for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    return b;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<std::vector<uint8_t>> inputs;
    for (int i = 1; i < argc; ++i) {
        std::ifstream f(argv[i], std::ios::binary);
        if (!f) {
            std::fprintf(stderr, "gguf_fuzzer_replay: cannot read %s\n", argv[i]);
            return 2;
        }
        inputs.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    if (argc == 1) {
        inputs = {{},           {'G', 'G', 'U', 'F'}, header(0, 0),
                  header(1, 0), header(0, 1),         header(~uint64_t(0), ~uint64_t(0))};
        std::vector<uint8_t> truncated_key = header(0, 1);
        truncated_key.insert(truncated_key.end(), {5, 0, 0, 0, 0, 0, 0, 0, 'a', 'b'});  // key length 5, 2 bytes of it
        inputs.push_back(truncated_key);
    }
    for (const auto &in : inputs) LLVMFuzzerTestOneInput(in.data(), in.size());
    std::printf("gguf_fuzzer_replay: %zu inputs, no invariant broken\n", inputs.size());
    return 0;
}
