#include "shardwise/ops/families.h"
namespace shardwise::ops { void register_unary_ops(OpRegistry&) {} }
