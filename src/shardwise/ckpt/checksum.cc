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

FileDigest digest_file(const fs::path& path, bool with_sha256) {
  MappedFile f(path);
  FileDigest d;
  d.size = f.size();
  f.will_need(0, f.size());
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> st(XXH64_createState(), XXH64_freeState);
  SW_CHECK(st && XXH64_reset(st.get(), 0) == XXH_OK, "xxHash: cannot start");
  for (uint64_t at = 0; at < f.size(); at += kSlice) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kSlice, f.size() - at));
    XXH64_update(st.get(), f.data() + at, n);
  }
  XXH64_canonical_t c;
  XXH64_canonicalFromHash(&c, XXH64_digest(st.get()));
  d.xxh64 = hex(c.digest, sizeof(c.digest));
  if (with_sha256) d.sha256 = sha256_hex(f.bytes());
  return d;
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
