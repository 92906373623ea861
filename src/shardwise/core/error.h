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

// What an error is about, for callers that sort errors (the Python package raises a subclass of
// shardwise.Error for each): bad options or arguments, a checkpoint, the training data.
enum class ErrorKind { General, Usage, Checkpoint, Data };

// An Error that says what it is about; its message is the same as without the kind.
class KindedError : public Error {
 public:
  KindedError(ErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// The kind of `e`: a KindedError's, General for any other exception.
inline ErrorKind error_kind(const std::exception& e) {
  const auto* k = dynamic_cast<const KindedError*>(&e);
  return k ? k->kind() : ErrorKind::General;
}

// Runs `f`; a shardwise::Error it throws becomes a KindedError of `kind` (unless it has a kind).
template <class F>
auto raising(ErrorKind kind, F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const KindedError&) {
    throw;
  } catch (const Error& e) {
    throw KindedError(kind, e.what());
  }
}

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
