// A main for a fuzzer's entry point without libFuzzer (gguf_fuzzer.cpp, grammar_fuzzer.cpp): runs
// LLVMFuzzerTestOneInput on each file named on the command line (a crash input libFuzzer saved, replayed with GCC's
// sanitizers), or with no arguments on the fuzzer's built-in inputs (CTest: keeps the fuzzer's source list compiling
// and linking in every build).
//
//   ./build/tests/gguf_fuzzer_replay crash-1234abcd
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// The fuzzer's own built-in inputs (each fuzzer source defines them).
std::vector<std::vector<uint8_t>> fuzz_builtin_inputs();

int main(int argc, char **argv) {
    std::vector<std::vector<uint8_t>> inputs;
    for (int i = 1; i < argc; ++i) {
        std::ifstream f(argv[i], std::ios::binary);
        if (!f) {
            std::fprintf(stderr, "%s: cannot read %s\n", argv[0], argv[i]);
            return 2;
        }
        inputs.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    if (argc == 1) inputs = fuzz_builtin_inputs();
    for (const auto &in : inputs) LLVMFuzzerTestOneInput(in.data(), in.size());
    std::printf("%s: %zu inputs, no invariant broken\n", argv[0], inputs.size());
    return 0;
}
