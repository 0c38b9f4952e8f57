#include <cstdio>
#include <exception>
#include <map>

#include "commands.h"
#include "core/error.h"

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
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        return app.exit(e);
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
