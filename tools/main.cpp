#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"

namespace {
// llama.cpp's multi-letter single-dash flags, which CLI11 cannot name directly: rewritten to their long
// forms before parsing so that users' muscle memory works.
std::vector<std::string> translate_llama_flags(int argc, char **argv) {
    static const std::map<std::string, std::string> aliases = {
        {"-ub", "--ubatch-size"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-np", "--parallel"}};
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) {
        const auto it = aliases.find(argv[i]);
        args.push_back(it != aliases.end() ? it->second : std::string(argv[i]));
    }
    return args;
}
}  // namespace

int main(int argc, char **argv) {
    using namespace sparrow::tools;
    CLI::App app{"sparrow: an inference engine for sparse-attention language models", "sparrow"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "sparrow 0.1.0");
    std::map<std::string, Command> commands;
    commands["inspect"] = register_inspect(app);
    commands["run"] = register_run(app);
    commands["perplexity"] = register_perplexity(app);
    commands["make-model"] = register_make_model(app);
    commands["bench"] = register_bench(app);
    commands["batched"] = register_batched(app);
    commands["serve"] = register_serve(app);
    try {
        std::vector<std::string> args = translate_llama_flags(argc, argv);
        std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
        app.parse(args);
    } catch (const CLI::ParseError &e) {
        // CLI11 prints the message (or the help) and returns its own code per kind of error (105 for a value
        // out of range, 109 for an unknown flag, ...); a usage error exits 2, as getopt tools and argparse do.
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        for (const auto &[name, run] : commands) {
            if (app.got_subcommand(name)) return run();
        }
    } catch (const sparrow::Error &e) {
        std::fprintf(stderr, "sparrow: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "sparrow: error: out of memory\n");
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "sparrow: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
