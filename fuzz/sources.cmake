# The sources the GGUF fuzzer compiles into itself (the reader and what it needs), shared by the libFuzzer target
# (fuzz/CMakeLists.txt) and the replay test (tests/CMakeLists.txt), so that a reader dependency added later breaks
# the replay's link in every build, not only the clang-only fuzzer's.
set(SPARROW_GGUF_FUZZ_SOURCES
    ${PROJECT_SOURCE_DIR}/src/gguf/gguf_reader.cpp
    ${PROJECT_SOURCE_DIR}/src/gguf/gguf_writer.cpp
    ${PROJECT_SOURCE_DIR}/src/core/dtype.cpp
    ${PROJECT_SOURCE_DIR}/src/core/kquants.cpp
    ${PROJECT_SOURCE_DIR}/src/core/quants32.cpp
    ${PROJECT_SOURCE_DIR}/src/core/error.cpp
    ${PROJECT_SOURCE_DIR}/src/core/mapped_file.cpp)

# The grammar fuzzer's sources (fuzz/grammar_fuzzer.cpp and its replay test), for the same reason.
set(SPARROW_GRAMMAR_FUZZ_SOURCES
    ${PROJECT_SOURCE_DIR}/src/runtime/grammar.cpp
    ${PROJECT_SOURCE_DIR}/src/runtime/grammar_constraint.cpp
    ${PROJECT_SOURCE_DIR}/src/runtime/constraint.cpp
    ${PROJECT_SOURCE_DIR}/src/runtime/sampler.cpp
    ${PROJECT_SOURCE_DIR}/src/core/error.cpp)

# The tool-call fuzzer's sources (fuzz/tool_calls_fuzzer.cpp and its replay test), for the same reason.
set(SPARROW_TOOL_CALLS_FUZZ_SOURCES
    ${PROJECT_SOURCE_DIR}/src/server/tool_calls.cpp
    ${PROJECT_SOURCE_DIR}/src/server/tool_grammar.cpp
    ${PROJECT_SOURCE_DIR}/src/runtime/grammar.cpp
    ${PROJECT_SOURCE_DIR}/src/core/error.cpp)
