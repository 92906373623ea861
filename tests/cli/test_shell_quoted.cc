// The run header's options line and the printed resume command quote each argument the way a POSIX
// shell reads it back: checked by running `printf '%s\n'` on the quoted words through /bin/sh.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "shardwise/cli/train/run_header.h"

namespace shardwise::cli {
namespace {

std::string shell_echo(const std::string& words) {
  std::string out;
  FILE* p = ::popen(("printf '%s\\n' " + words).c_str(), "r");
  if (!p) return "(popen failed)";
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  return out;
}

TEST(ShellQuoted, PlainWordsStayAndOthersComeBackFromTheShellUnchanged) {
  EXPECT_EQ(shell_quoted("dp=2,tp=2"), "dp=2,tp=2");
  EXPECT_EQ(shell_quoted("runs/demo-1/checkpoints"), "runs/demo-1/checkpoints");
  const std::vector<std::string> odd = {"", "two words", "it's", "$HOME", "a*b", "x;y", "'", "back\\slash", "[R]"};
  for (const std::string& arg : odd) {
    EXPECT_NE(shell_quoted(arg), arg) << arg;
    EXPECT_EQ(shell_echo(shell_quoted(arg)), arg + "\n") << shell_quoted(arg);
  }
}

}  // namespace
}  // namespace shardwise::cli
