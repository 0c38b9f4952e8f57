#include "commands.h"
namespace sparrow::tools {
Command register_perplexity(CLI::App &app) {
    app.add_subcommand("perplexity", "not yet implemented");
    return [] { return 1; };
}
}  // namespace sparrow::tools
