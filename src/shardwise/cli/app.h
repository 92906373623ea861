#pragma once
namespace shardwise::cli {
// Runs the shardwise command line; returns the process exit code.
int run(int argc, char** argv);
}  // namespace shardwise::cli
