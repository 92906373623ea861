// The safetensors reader and writer against independent references: the Hugging Face fixture (its
// bytes were written by the reference library), byte strings written out by hand here, and one
// hand-made file per broken rule.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "shardwise/ckpt/safetensors_reader.h"
#include "shardwise/ckpt/safetensors_writer.h"
#include "shardwise/core/error.h"

namespace shardwise::ckpt {
namespace {

const fs::path kFixture = fs::path(SHARDWISE_CKPT_FIXTURES) / "hf_mlp_f32_with_metadata.safetensors";

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// A file from a header text and a data size: 8-byte little-endian length, header, zero data.
std::vector<std::byte> file_with_header(std::string_view header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  s += header;
  s.append(data_bytes, '\0');
  return bytes_of(s);
}

std::string error_of(const std::vector<std::byte>& file) {
  try {
    parse_safetensors(file, "bad.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsReader, ReadsTheHuggingFaceFixtureExactly) {
  SafetensorsFile f(kFixture);
  const StHeader& h = f.header();
  EXPECT_EQ(h.header_size, 320u);
  ASSERT_TRUE(h.has_metadata);
  ASSERT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata[0], (std::pair<std::string, std::string>{"version", "1.0"}));  // file order kept
  EXPECT_EQ(h.metadata[1], (std::pair<std::string, std::string>{"git_tag", "v1.45"}));
  ASSERT_EQ(h.tensors.size(), 4u);
  const char* names[] = {"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"};
  const Shape shapes[] = {Shape{20}, Shape{20, 10}, Shape{10}, Shape{10, 20}};
  const uint64_t ends[] = {80, 880, 920, 1720};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(h.tensors[i].name, names[i]);
    EXPECT_EQ(h.tensors[i].dtype, StDType::F32);
    EXPECT_EQ(h.tensors[i].shape, shapes[i]);
    EXPECT_EQ(h.tensors[i].end, ends[i]);
  }
  EXPECT_EQ(h.data_start() + h.data_size(), 2048u);
  // Values read with Python's struct module from the raw file, independently of this reader.
  Tensor bias = f.read("fc1.bias");
  EXPECT_EQ(bias.data<float>()[0], -0.21289686858654022f);
  EXPECT_EQ(bias.data<float>()[1], 0.0528571754693985f);
  EXPECT_EQ(bias.data<float>()[2], -0.24906551837921143f);
  EXPECT_EQ(bias.data<float>()[3], -0.043041668832302094f);
  // A box reads exactly the elements of the whole tensor it covers.
  Tensor w = f.read("fc1.weight");
  reshard::Box box;
  box.shape = Shape{3, 4};
  box.offset[0] = 5;
  box.offset[1] = 6;
  Tensor part = f.read_box("fc1.weight", box);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(part.data<float>()[r * 4 + c], w.data<float>()[(5 + r) * 10 + 6 + c]);
  }
}

TEST(SafetensorsWriter, RewritesTheFixtureByteForByte) {
  SafetensorsFile f(kFixture);
  std::vector<Tensor> keep;
  std::vector<StEntry> entries;
  for (const auto& t : f.tensors()) {
    keep.push_back(f.read(t.name));
    entries.push_back(entry_of(t.name, keep.back()));
  }
  std::reverse(entries.begin(), entries.end());  // input order must not matter
  auto out = serialize_safetensors(entries, f.header().metadata);
  ASSERT_EQ(out.size(), f.header().data_start() + f.header().data_size());
  EXPECT_EQ(std::memcmp(out.data(), MappedFile(kFixture).data(), out.size()), 0);
}

TEST(SafetensorsWriter, MatchesHandWrittenBytes) {
  // {"attn.0": F32 [1,2,3] = 0..5}: a 64-byte header needs no padding.
  std::vector<float> v = {0, 1, 2, 3, 4, 5};
  Tensor t = Tensor::from<float>(Shape{1, 2, 3}, v);
  StEntry e = entry_of("attn.0", t);
  auto out = serialize_safetensors(std::span(&e, 1));
  std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);
  std::vector<std::byte> want = file_with_header(header, 0);
  want.insert(want.end(), t.raw(), t.raw() + 24);
  EXPECT_EQ(out, want);
  // No tensors: "{}" padded with six spaces; metadata comes first.
  EXPECT_EQ(serialize_safetensors({}), file_with_header("{}      ", 0));
  EXPECT_EQ(serialize_safetensors({}, StMetadata{{"framework", "pt"}}),
            file_with_header(R"({"__metadata__":{"framework":"pt"}}     )", 0));
}

TEST(SafetensorsWriter, OrdersByDtypeAlignmentThenName) {
  Tensor a(DType::F32, Shape{2}), b(DType::I64, Shape{1}), c(DType::BF16, Shape{3}), d(DType::U8, Shape{5}),
      e(DType::F32, Shape{0});
  std::vector<StEntry> entries = {entry_of("a", a), entry_of("b", b), entry_of("c", c), entry_of("d", d),
                                  entry_of("0empty", e)};
  auto out = serialize_safetensors(entries);
  StHeader h = parse_safetensors(out, "mem");
  std::vector<std::string> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  // Equal offsets (the empty tensor) keep the writer's order.
  EXPECT_EQ(names, (std::vector<std::string>{"b", "0empty", "a", "c", "d"}));
  EXPECT_EQ(h.header_size % 8, 0u);
  EXPECT_EQ(h.find("c")->begin, 16u);
}

TEST(SafetensorsWriter, AtomicFileRoundTripsByteIdentically) {
  fs::path dir = fs::temp_directory_path() / ("sw_st_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Tensor x = Tensor::from<int32_t>(Shape{2, 2}, std::vector<int32_t>{1, -2, 3, -4});
  Tensor s = Tensor::scalar<double>(2.5);
  std::vector<StEntry> entries = {entry_of("x", x), entry_of("s", s)};
  write_safetensors(dir / "a.safetensors", entries, StMetadata{{"format", "pt"}, {"a\"b", "\n"}});
  SafetensorsFile f(dir / "a.safetensors");
  EXPECT_EQ(*f.header().metadata_value("a\"b"), "\n");
  EXPECT_EQ(f.read("s").data<double>()[0], 2.5);
  std::vector<Tensor> keep;
  std::vector<StEntry> again;
  for (const auto& t : f.tensors()) {
    keep.push_back(f.read(t.name));
    again.push_back(entry_of(t.name, keep.back()));
  }
  write_safetensors(dir / "b.safetensors", again, f.header().metadata);
  EXPECT_EQ(read_text_file(dir / "a.safetensors"), read_text_file(dir / "b.safetensors"));
  // No temporary file is left behind.
  int n = 0;
  for ([[maybe_unused]] const auto& p : fs::directory_iterator(dir)) ++n;
  EXPECT_EQ(n, 2);
  fs::remove_all(dir);
}

struct BadCase {
  const char* header;
  size_t data;
  const char* expect;  // rule and detail fragments
  const char* tensor;  // named tensor, or ""
};

TEST(SafetensorsReader, NamesTheFileTensorAndRuleOfEachViolation) {
  const BadCase cases[] = {
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )", 4, "rule 'file length'", ""},
      {R"({"w":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8, "rule 'dtype'", "w"},
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "rule 'size'", "w"},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "rule 'shape'", "w"},
      {R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8, "rule 'shape'", "w"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "rule 'data_offsets'", "w"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "rule 'data_offsets'", "w"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, "unknown key 'x'", "w"},
      {R"({"w":{"dtype":"F32","shape":[2]}})", 8, "missing key 'data_offsets'", "w"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3,
       "overlap", "b"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})", 5,
       "leave a gap", "b"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4, "leave a gap", "a"},
      {R"({"__metadata__":{"k":1}})", 0, "rule 'metadata'", ""},
      {R"({"__metadata__":"x"})", 0, "rule 'metadata'", ""},
      {R"([1,2])", 0, "rule 'header JSON'", ""},
      {R"({"w":)", 0, "rule 'header JSON'", ""},
      {R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, "more than once", "a"},
      {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}})", 0, "overflows",
       "w"},
      {R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", 0, "overflows", "w"},
      {R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1, "9 dims", "w"},
      {"{\"w\xff\":1}", 0, "rule 'header UTF-8'", ""},
      {"{\"\xc0\xaf\":1}", 0, "rule 'header UTF-8'", ""},     // overlong '/'
      {"{\"\xed\xa0\x80\":1}", 0, "rule 'header UTF-8'", ""},  // surrogate
  };
  for (const BadCase& c : cases) {
    std::string msg = error_of(file_with_header(c.header, c.data));
    EXPECT_NE(msg.find("safetensors file 'bad.safetensors'"), std::string::npos) << c.header << "\n" << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << "\n" << msg;
    if (*c.tensor) {
      EXPECT_NE(msg.find(std::string("tensor '") + c.tensor + "'"), std::string::npos) << msg;
    }
  }
  // Header length rules.
  EXPECT_NE(error_of(bytes_of("abc")).find("rule 'file size'"), std::string::npos);
  std::vector<std::byte> huge = file_with_header("{}", 0);
  huge[7] = std::byte{0x80};  // 2^63 + 2
  EXPECT_NE(error_of(huge).find("exceeds the cap"), std::string::npos);
  std::vector<std::byte> past = file_with_header("{}", 0);
  past[0] = std::byte{100};
  EXPECT_NE(error_of(past).find("runs past the end"), std::string::npos);
  // Every valid dtype name is accepted, raw ones included.
  for (StDType d : kAllStDTypes) {
    std::string h = fmt::format(R"({{"w":{{"dtype":"{}","shape":[3],"data_offsets":[0,{}]}}}})", st_dtype_name(d),
                                3 * st_dtype_size(d));
    EXPECT_EQ(error_of(file_with_header(h, 3 * st_dtype_size(d))), "") << h;
  }
}

TEST(SafetensorsReader, RawDtypesReadAsBytesNotTensors) {
  std::string h = R"({"f8":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})";
  fs::path p = fs::temp_directory_path() / ("sw_f8_" + std::to_string(::getpid()) + ".safetensors");
  auto b = file_with_header(h, 2);
  b[b.size() - 1] = std::byte{0x38};
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  SafetensorsFile f(p);
  EXPECT_EQ(f.info("f8").dtype, StDType::F8_E4M3);
  EXPECT_EQ(f.data(f.info("f8"))[1], std::byte{0x38});
  try {
    f.read("f8");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F8_E4M3"), std::string::npos);
  }
  fs::remove(p);
}

}  // namespace
}  // namespace shardwise::ckpt
