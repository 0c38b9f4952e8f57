// The `sparrow` subcommands. Each registers its flags on a CLI11 subcommand and returns the function that
// runs it (after parsing); main() catches sparrow::Error at this boundary and exits non-zero.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace sparrow::tools {

using Command = std::function<int()>;

// What `sparrow --version` prints and `serve`'s GET /props reports as build_info.
inline constexpr const char *kVersion = "sparrow 0.1.0";

Command register_inspect(CLI::App &app);
Command register_run(CLI::App &app);
Command register_perplexity(CLI::App &app);
Command register_make_model(CLI::App &app);
Command register_bench(CLI::App &app);
Command register_batched(CLI::App &app);
Command register_serve(CLI::App &app);

}  // namespace sparrow::tools
