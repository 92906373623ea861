#include "shardwise/ckpt/checksum.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <vector>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

// Hashes in slices so a multi-GB mapping is streamed (the page cache holds it, not the heap).
constexpr size_t kSlice = size_t{64} << 20;

}  // namespace

std::string xxh64_hex(std::span<const std::byte> bytes) {
  XXH64_hash_t h = XXH64(bytes.data(), bytes.size(), 0);
  XXH64_canonical_t c;
  XXH64_canonicalFromHash(&c, h);
  return hex(c.digest, sizeof(c.digest));
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  SW_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "OpenSSL: cannot start SHA-256");
  for (size_t at = 0; at < bytes.size(); at += kSlice) {
    size_t n = std::min(kSlice, bytes.size() - at);
    SW_CHECK(EVP_DigestUpdate(ctx.get(), bytes.data() + at, n) == 1, "OpenSSL: SHA-256 update failed");
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  SW_CHECK(EVP_DigestFinal_ex(ctx.get(), out, &len) == 1, "OpenSSL: SHA-256 final failed");
  return hex(out, len);
}

struct StreamDigest::State {
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> xxh{XXH64_createState(), XXH64_freeState};
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha{nullptr, EVP_MD_CTX_free};
  uint64_t size = 0;
};

StreamDigest::StreamDigest(bool with_sha256) : state_(std::make_unique<State>()) {
  SW_CHECK(state_->xxh && XXH64_reset(state_->xxh.get(), 0) == XXH_OK, "xxHash: cannot start");
  if (with_sha256) {
    state_->sha.reset(EVP_MD_CTX_new());
    SW_CHECK(state_->sha && EVP_DigestInit_ex(state_->sha.get(), EVP_sha256(), nullptr) == 1,
             "OpenSSL: cannot start SHA-256");
  }
}

StreamDigest::~StreamDigest() = default;

void StreamDigest::update(std::span<const std::byte> bytes) {
  for (size_t at = 0; at < bytes.size(); at += kSlice) {
    size_t n = std::min(kSlice, bytes.size() - at);
    XXH64_update(state_->xxh.get(), bytes.data() + at, n);
    if (state_->sha) SW_CHECK(EVP_DigestUpdate(state_->sha.get(), bytes.data() + at, n) == 1, "OpenSSL: SHA-256 update failed");
  }
  state_->size += bytes.size();
}

FileDigest StreamDigest::finish() {
  FileDigest d;
  d.size = state_->size;
  XXH64_canonical_t c;
  XXH64_canonicalFromHash(&c, XXH64_digest(state_->xxh.get()));
  d.xxh64 = hex(c.digest, sizeof(c.digest));
  if (state_->sha) {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    SW_CHECK(EVP_DigestFinal_ex(state_->sha.get(), out, &len) == 1, "OpenSSL: SHA-256 final failed");
    d.sha256 = hex(out, len);
  }
  return d;
}

FileDigest digest_file(const fs::path& path, bool with_sha256) {
  MappedFile f(path);
  f.will_need(0, f.size());
  StreamDigest digest(with_sha256);
  digest.update(f.bytes());
  return digest.finish();
}

FileSample sample_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  SW_CHECK(f.good(), "cannot read '{}'", path.string());
  f.seekg(0, std::ios::end);
  FileSample out;
  out.size = static_cast<int64_t>(f.tellg());
  auto mib_at = [&](int64_t offset) {
    std::vector<std::byte> buf(static_cast<size_t>(std::min<int64_t>(out.size - offset, int64_t{1} << 20)));
    f.seekg(offset);
    f.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    SW_CHECK(f.good(), "cannot read '{}'", path.string());
    return xxh64_hex(buf);
  };
  out.head_xxh64 = mib_at(0);
  out.tail_xxh64 = mib_at(std::max<int64_t>(0, out.size - (int64_t{1} << 20)));
  return out;
}

}  // namespace shardwise::ckpt
