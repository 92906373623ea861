// Calls one rule N times; run under callgrind twice (N and 2N) so start-up cancels out:
// instructions per call = (I(2N) - I(N)) / N. Usage: rule_calls INDEX N | rule_calls --list
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/rule_cases.h"

int main(int argc, char** argv) {
  auto calls = shardwise::bench::rule_calls();
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < calls.size(); ++i) std::printf("%zu\t%s\n", i, calls[i].label.c_str());
    return 0;
  }
  if (argc != 3) {
    std::fprintf(stderr, "usage: rule_calls INDEX N | rule_calls --list\n");
    return 2;
  }
  size_t index = std::strtoul(argv[1], nullptr, 10);
  long n = std::strtol(argv[2], nullptr, 10);
  if (index >= calls.size()) return 2;
  size_t sink = 0;
  for (long i = 0; i < n; ++i) sink += calls[index].call().outputs.size();
  return sink == static_cast<size_t>(n) ? 0 : 1;
}
