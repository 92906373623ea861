#pragma once
// The one exception type of shardwise. Messages say what was wrong, the value, and what is allowed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace shardwise {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace shardwise

// Checks a condition on user input; throws shardwise::Error with the formatted message.
#define SW_CHECK(cond, ...)                  \
  do {                                       \
    if (!(cond)) ::shardwise::fail(__VA_ARGS__); \
  } while (0)
