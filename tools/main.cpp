#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"

namespace {
// llama.cpp's multi-letter single-dash flags, which CLI11 cannot name directly: rewritten to their long
// forms before parsing so that users' muscle memory works. Only where an option may stand: the value of an
// option ("-p -ub" prompts with the text "-ub") and everything after "--" stay as typed; one the subcommand
// does not have is refused under the name the user typed.
std::vector<std::string> translate_llama_flags(const CLI::App &app, int argc, char **argv) {
    static const std::map<std::string, std::string> aliases = {
        {"-ub", "--ubatch-size"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-np", "--parallel"}};
    std::vector<std::string> args;
    const CLI::App *command = nullptr;  // the subcommand, once named
    bool value_next = false;            // the previous argument was an option that takes a value
    bool verbatim = false;              // after "--"
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (verbatim || value_next) {
            value_next = false;
            args.push_back(std::move(arg));
            continue;
        }
        if (arg == "--") {
            verbatim = true;
        } else if (!command) {
            if (arg.empty() || arg[0] != '-') {
                try {
                    command = app.get_subcommand(arg);
                } catch (const CLI::OptionNotFound &) {  // not a command: CLI11 says so when it parses
                }
            }
        } else if (arg.size() > 1 && arg[0] == '-' && arg.find('=') == std::string::npos) {
            const auto alias = aliases.find(arg);
            if (alias != aliases.end()) {
                // Left as typed, CLI11 would read "-np" as "-n p" and blame -n.
                if (!command->get_option_no_throw(alias->second)) throw CLI::ExtrasError({arg});
                arg = alias->second;
            }
            // "-t" or "--threads" alone takes the next argument as its value; "-t2" holds its own.
            const bool whole_name = arg.rfind("--", 0) == 0 || arg.size() == 2;
            const CLI::Option *opt = whole_name ? command->get_option_no_throw(arg) : nullptr;
            value_next = opt && opt->get_items_expected_max() > 0;
        }
        args.push_back(std::move(arg));
    }
    return args;
}

// Results go to stdout: a write that failed (a full disk, a closed pipe) is an error, not a success.
int checked_stdout(int status) {
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        std::fprintf(stderr, "sparrow: error: cannot write the output to stdout: %s\n", std::strerror(errno));
        return status == 0 ? 1 : status;
    }
    return status;
}
}  // namespace

int main(int argc, char **argv) {
    using namespace sparrow::tools;
    CLI::App app{"sparrow: an inference engine for sparse-attention language models", "sparrow"};
    app.require_subcommand(1);
    app.set_version_flag("--version", kVersion);
    std::map<std::string, Command> commands;
    commands["inspect"] = register_inspect(app);
    commands["run"] = register_run(app);
    commands["perplexity"] = register_perplexity(app);
    commands["make-model"] = register_make_model(app);
    commands["bench"] = register_bench(app);
    commands["batched"] = register_batched(app);
    commands["serve"] = register_serve(app);
    try {
        std::vector<std::string> args = translate_llama_flags(app, argc, argv);
        std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
        app.parse(args);
    } catch (const CLI::ParseError &e) {
        // CLI11 prints the message (or the help) and returns its own code per kind of error (105 for a value
        // out of range, 109 for an unknown flag, ...); a usage error exits 2, as getopt tools and argparse do.
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        for (const auto &[name, run] : commands) {
            if (app.got_subcommand(name)) return checked_stdout(run());
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
