#pragma once
// shardwise's C++ errors as Python exceptions: shardwise.Error (a RuntimeError) with the C++
// message, and subclasses for usage, checkpoint and data errors: the error's own kind
// (core/error.h), else the one the failing call gives (raising).
#include <nanobind/nanobind.h>

#include <utility>

#include "shardwise/core/error.h"

namespace shardwise::py {

namespace nb = nanobind;

// Defines shardwise.Error, UsageError, CheckpointError, DataError and the translator.
void bind_errors(nb::module_& m);

}  // namespace shardwise::py
