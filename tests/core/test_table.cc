#include <gtest/gtest.h>

#include "shardwise/core/error.h"
#include "shardwise/core/table.h"

namespace shardwise {
namespace {

using A = TextTable::Align;

TEST(TextTable, ColumnsAreAsWideAsTheirWidestCell) {
  TextTable t({A::Left, A::Right, A::Left}, "  ");
  t.row({"name", "size", "file"});
  t.row({"a.very.long.tensor.name.that.is.wider.than.forty.characters", "12 KiB", "model.safetensors"});
  t.line("    = a note that widens nothing, and is printed as it is");
  t.row({"b", "1.5 MiB"});
  EXPECT_EQ(t.str(),
            "  name                                                            size  file\n"
            "  a.very.long.tensor.name.that.is.wider.than.forty.characters   12 KiB  model.safetensors\n"
            "      = a note that widens nothing, and is printed as it is\n"
            "  b                                                            1.5 MiB\n");
  EXPECT_THROW(t.row({"1", "2", "3", "4"}), Error);
}

}  // namespace
}  // namespace shardwise
