#include "commands.h"
namespace sparrow::tools {
Command register_make_model(CLI::App &app) {
    app.add_subcommand("make-model", "not yet implemented");
    return [] { return 1; };
}
}  // namespace sparrow::tools
