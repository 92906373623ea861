#pragma once
// The message of the shardwise::Error `f` throws, "(no error)" when it throws none.
#include <functional>
#include <string>

#include "shardwise/core/error.h"

namespace shardwise {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace shardwise
