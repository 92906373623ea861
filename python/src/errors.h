#pragma once
// shardwise's C++ errors as Python exceptions: shardwise.Error (a RuntimeError) with the C++
// message, and subclasses for usage, checkpoint and data errors, chosen by the call that failed.
#include <nanobind/nanobind.h>

#include <utility>

#include "shardwise/core/error.h"

namespace shardwise::py {

namespace nb = nanobind;

enum class ErrorKind { General, Usage, Checkpoint, Data };

// A shardwise::Error raised inside a call of this kind.
class KindedError : public Error {
 public:
  KindedError(ErrorKind kind, const std::string& message) : Error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

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

// Defines shardwise.Error, UsageError, CheckpointError, DataError and the translator.
void bind_errors(nb::module_& m);

}  // namespace shardwise::py
