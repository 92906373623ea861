#include "shardwise/cli/app.h"

int main(int argc, char** argv) { return shardwise::cli::run(argc, argv); }
