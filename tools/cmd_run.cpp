#include "commands.h"
namespace sparrow::tools {
Command register_run(CLI::App &app) {
    app.add_subcommand("run", "not yet implemented");
    return [] { return 1; };
}
}  // namespace sparrow::tools
