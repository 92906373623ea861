// The storage-only dtypes (u16, u32, u64: safetensors' U16, U32, U64) through the checkpoint path:
// a file written byte by byte here reads as tensors of those dtypes with the file's own bytes, the
// writer writes their names and bytes, and a save on one topology loads on every other bit for bit
// (the blocks compared with slices of the global tensor); a conversion of them is refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "ckpt_test_util.h"
#include "shardwise/ckpt/group_reader.h"
#include "shardwise/ckpt/manifest.h"
#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/comm/local.h"
#include "shardwise/core/error.h"
#include "../support/error_of.h"

namespace shardwise::ckpt {
namespace {

using namespace testing;

// Every byte a formula of (seed, index), so the top bits of u64 values (above 2^53, where a double
// loses them) are set too.
Tensor pattern(DType dtype, const Shape& shape, int seed) {
  Tensor t = Tensor::uninitialized(dtype, shape);
  for (size_t i = 0; i < t.nbytes(); ++i) t.raw()[i] = static_cast<std::byte>((i * 151 + static_cast<size_t>(seed) * 29 + 255) & 0xff);
  return t;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

TEST(StorageOnlyDTypes, AHandWrittenFileReadsAsTheirDtypesWithTheFilesBytes) {
  ScratchDir scratch("u_read");
  // a: U64 [2] = {2^64 - 1, 2^63 + 5}; b: U32 [3] = {4294967295, 1, 305419896}; c: U16 [2] = {65535, 4660}.
  const std::string header = R"({"a":{"dtype":"U64","shape":[2],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"U32","shape":[3],"data_offsets":[16,28]},)"
                             R"("c":{"dtype":"U16","shape":[2],"data_offsets":[28,32]}})";
  std::string data;
  data += le64(~uint64_t{0}) + le64((uint64_t{1} << 63) + 5);
  for (uint32_t v : {4294967295u, 1u, 305419896u}) data += le64(v).substr(0, 4);
  for (uint16_t v : {uint16_t{65535}, uint16_t{4660}}) data += le64(v).substr(0, 2);
  const fs::path file = scratch.path / "model.safetensors";
  std::ofstream(file, std::ios::binary) << le64(header.size()) << header << data;
  SafetensorsFile f(file);
  Tensor a = f.read("a"), b = f.read("b"), c = f.read("c");
  ASSERT_EQ(a.dtype(), DType::U64);
  ASSERT_EQ(b.dtype(), DType::U32);
  ASSERT_EQ(c.dtype(), DType::U16);
  EXPECT_EQ(a.data<uint64_t>()[0], ~uint64_t{0});
  EXPECT_EQ(a.data<uint64_t>()[1], (uint64_t{1} << 63) + 5);
  EXPECT_EQ((std::vector<uint32_t>(b.data<uint32_t>(), b.data<uint32_t>() + 3)),
            (std::vector<uint32_t>{4294967295u, 1u, 305419896u}));
  EXPECT_EQ(c.data<uint16_t>()[0], 65535);
  EXPECT_EQ(c.data<uint16_t>()[1], 4660);
  // A box of one (a column block's read path) gives the same bytes.
  reshard::Box box;
  box.shape = Shape{1};
  box.offset[0] = 2;
  EXPECT_EQ(f.read_box("b", box).data<uint32_t>()[0], 305419896u);
}

TEST(StorageOnlyDTypes, TheWriterWritesTheirNamesAndBytes) {
  Tensor t = pattern(DType::U32, Shape{2}, 3);
  StEntry e = entry_of("w", t);
  auto out = serialize_safetensors(std::span(&e, 1));
  const std::string header = R"({"w":{"dtype":"U32","shape":[2],"data_offsets":[0,8]}})";
  std::string want = le64(header.size() + 2) + header + "  ";  // padded to 8 bytes
  std::vector<std::byte> bytes(want.size());
  std::memcpy(bytes.data(), want.data(), want.size());
  bytes.insert(bytes.end(), t.raw(), t.raw() + 8);
  EXPECT_EQ(out, bytes);
}

// The storage-only tensors of a model, with shapes whose dims split unevenly (and into empty blocks
// over 4 ranks), under placements of the test topologies.
std::vector<GlobalTensor> unsigned_model() {
  return {{"model", "counts", pattern(DType::U64, Shape{5, 3}, 1)},
          {"model", "ids", pattern(DType::U32, Shape{3, 7}, 2)},
          {"model", "codes", pattern(DType::U16, Shape{9}, 3)}};
}

std::vector<Topology> unsigned_topologies() {
  return {{"single", "1", {{"*", "R"}}},
          {"fsdp4", "fsdp=4", {{"*", "S(0)"}}},
          {"tp3", "tp=3", {{"*", "S(1)"}, {"codes", "S(0)"}}},
          {"dp2tp2", "dp=2,tp=2", {{"*", "S(0),S(1)"}, {"codes", "R,S(0)"}}}};
}

TEST(StorageOnlyDTypes, SavedOnOneTopologyTheyLoadOnEveryOtherBitForBit) {
  const auto model = unsigned_model();
  for (const Topology& from : unsigned_topologies()) {
    ScratchDir scratch("u_rt");
    comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(from.mesh).size()), [&](comm::Communicator& c) {
      save_checkpoint(c, scratch.path, content_for(model, from, c.rank(), 1));
    });
    const fs::path dir = scratch.path / "checkpoint-1";
    ASSERT_TRUE(verify_checkpoint(dir).ok()) << from.label;
    for (const Topology& to : unsigned_topologies()) {
      comm::LocalWorld::run(static_cast<int>(mesh::parse_mesh(to.mesh).size()), [&](comm::Communicator& c) {
        std::vector<LoadSpec> specs;
        for (const auto& t : model) specs.push_back({t.name, t.value.shape(), t.value.dtype(), layout_of(to, t.name)});
        auto loaded = load_group(dir, "model", specs, c.rank());
        for (const auto& t : model) {
          EXPECT_TRUE(bit_equal(loaded.at(t.name), block_of(t.value, layout_of(to, t.name), c.rank())))
              << from.label << " -> " << to.label << " rank " << c.rank() << " " << t.name;
        }
      });
    }
  }
}

TEST(StorageOnlyDTypes, ALoadThatConvertsThemIsAnErrorNamingTheDtype) {
  ScratchDir scratch("u_conv");
  const auto model = unsigned_model();
  comm::LocalWorld::run(1, [&](comm::Communicator& c) {
    save_checkpoint(c, scratch.path, content_for(model, unsigned_topologies()[0], 0, 1));
  });
  LoadOptions options;
  options.convert_dtype = true;
  options.ignore_keys = {"counts", "codes"};
  std::vector<LoadSpec> specs = {{"ids", Shape{3, 7}, DType::F32, layout_of(unsigned_topologies()[0], "ids")}};
  const std::string msg = error_of([&] { load_group(scratch.path / "checkpoint-1", "model", specs, 0, options); });
  EXPECT_NE(msg.find("converting u32 to f32: dtype u32 is storage-only"), std::string::npos) << msg;
}

}  // namespace
}  // namespace shardwise::ckpt
