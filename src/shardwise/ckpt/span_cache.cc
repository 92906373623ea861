#include "shardwise/ckpt/span_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <compare>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "shardwise/core/error.h"

namespace shardwise::ckpt {

namespace {

std::atomic<uint64_t> g_read{0};    // bytes read into chunks
std::atomic<uint64_t> g_mapped{0};  // bytes of chunk buffers mapped now (in entries or free)
std::atomic<uint64_t> g_lead_timeouts{0};  // waits for a slower reader that ran out (lead_wait())

// An anonymous mapping (page-aligned, as O_DIRECT wants; unmapped, not kept by malloc, at the end).
struct Buffer {
  std::byte* p = nullptr;
  size_t cap = 0;
};

// Buffers of evicted entries, reused for the next chunks while a load runs (their pages are
// faulted in already); unmapped when the last SpanCacheUse ends.
struct Pool {
  std::mutex m;
  std::vector<Buffer> free;
};
Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: rank threads may outlive static destruction order
  return *p;
}

Buffer take_buffer(size_t cap) {
  {
    std::lock_guard lock(pool().m);
    auto& free = pool().free;
    auto it = std::find_if(free.begin(), free.end(), [&](const Buffer& b) { return b.cap == cap; });
    if (it != free.end()) {
      Buffer b = *it;
      free.erase(it);
      return b;
    }
  }
  void* p = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    fail("checkpoint load: cannot map a {}-byte span buffer: {}", cap, std::strerror(e));
  }
  if (load_tuning().huge_pages) ::madvise(p, cap, MADV_HUGEPAGE);
  g_mapped.fetch_add(cap);
  return {static_cast<std::byte*>(p), cap};
}

void give_buffer(Buffer b) {
  std::lock_guard lock(pool().m);
  pool().free.push_back(b);
}

void unmap_free_buffers() {
  std::lock_guard lock(pool().m);
  for (const Buffer& b : pool().free) {
    ::munmap(b.p, b.cap);
    g_mapped.fetch_sub(b.cap);
  }
  pool().free.clear();
}

// A chunk of a file: identity (device, inode, size, modification time) and chunk index.
struct Key {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  uint64_t chunk = 0;
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  Buffer buf;
  size_t n = 0;        // bytes of the file in the chunk (the last chunk of a file is shorter)
  bool ready = false;  // read (or failed: error)
  std::exception_ptr error;
  uint64_t used = 0;    // LRU tick
  uint64_t served = 0;  // slots (Reader::slot) of the readers that have copied from it
  explicit Entry(Buffer b, size_t bytes) : buf(b), n(bytes) {}
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() { give_buffer(buf); }
};

// A thread holding a SpanCacheUse (a rank loading). Once it reads through the cache it is
// "joined": it gets a slot (one bit of Entry::served) and counts the bytes of the spans it has
// passed (copied its runs out of), in the order it reads them. The ranks of a tp group read the
// same tensors in the same order, and their column blocks' spans have the same length (first run to
// last), so the difference of two readers' counts is how far one runs ahead of the other. (Counts
// of chunks would drift: the spans of ranks' blocks start at different columns and may meet one
// chunk more or less per tensor.)
using Clock = std::chrono::steady_clock;
struct Reader {
  int depth = 0;        // SpanCacheUses of this thread alive (load_group, then read_through_span_cache)
  int slot = -1;        // joined: 0..63; -1 before (or beyond 64 readers: not waited for)
  uint64_t passed = 0;  // bytes of spans passed so far
  bool inside = false;  // in read_through_span_cache now
  Clock::time_point left{};  // when it last returned from it
};

struct Cache {
  std::mutex m;
  std::condition_variable cv;
  std::map<Key, std::shared_ptr<Entry>> entries;
  uint64_t held = 0;  // buffer bytes of `entries`
  uint64_t tick = 0;
  int users = 0;
  std::map<std::thread::id, Reader> readers;
  uint64_t joined = 0;  // slots of the joined readers
};
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

// Drops ready entries (their users keep them alive until done) until `incoming` more bytes fit in
// `limit`: first those every joined reader has copied from, then the least recently used. Lock held.
void evict_for(Cache& c, uint64_t incoming, uint64_t limit) {
  auto rank = [&](const Entry& e) { return std::pair((c.joined & ~e.served) != 0, e.used); };
  while (c.held + incoming > limit) {
    auto victim = c.entries.end();
    for (auto it = c.entries.begin(); it != c.entries.end(); ++it) {
      if (it->second->ready && (victim == c.entries.end() || rank(*it->second) < rank(*victim->second))) victim = it;
    }
    if (victim == c.entries.end()) return;  // all being read: go over the limit for now
    c.held -= victim->second->buf.cap;
    c.entries.erase(victim);
  }
}

Key file_key(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail_errno("cannot stat", path);
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, 0};
}

}  // namespace

SpanCacheUse::SpanCacheUse() {
  std::lock_guard lock(cache().m);
  ++cache().users;
  ++cache().readers[std::this_thread::get_id()].depth;
}

SpanCacheUse::~SpanCacheUse() {
  Cache& c = cache();
  {
    std::lock_guard lock(c.m);
    auto it = c.readers.find(std::this_thread::get_id());
    if (--it->second.depth == 0) {  // this rank's load ends: nobody waits for it any more
      if (it->second.slot >= 0) c.joined &= ~(uint64_t{1} << it->second.slot);
      c.readers.erase(it);
    }
    if (--c.users == 0) {
      c.entries.clear();  // every reader is done: the buffers go back to the pool, then are unmapped
      c.held = 0;
      unmap_free_buffers();
    }
  }
  c.cv.notify_all();
}

bool span_cache_shared() {
  std::lock_guard lock(cache().m);
  return cache().users > 1;
}

uint64_t span_cache_held_bytes() { return g_mapped.load(); }
uint64_t span_cache_read_bytes() { return g_read.load(); }
uint64_t span_cache_lead_timeouts() { return g_lead_timeouts.load(); }

namespace {

// The bounds are LoadTuning's span_lead_wait_ms (default 2 s; a guard only: the slowest reader
// inside the cache always progresses, it never waits itself) and span_away_wait_ms (default 20 ms:
// a reader out of the cache this long, loading a tensor another way or done with spans, is not
// waited for; only a rank between two spans is).
std::chrono::milliseconds lead_wait() { return std::chrono::milliseconds(load_tuning().span_lead_wait_ms); }
std::chrono::milliseconds away_wait() { return std::chrono::milliseconds(load_tuning().span_away_wait_ms); }
// How often a waiting reader re-checks (a reader staying away wakes nobody).
constexpr auto kRecheck = std::chrono::milliseconds(20);

// The fewest bytes passed by a joined reader to be waited for: inside the cache now, or out of it
// for less than away_wait(). Lock held.
uint64_t slowest_passed(const Cache& c, Clock::time_point now) {
  uint64_t least = UINT64_MAX;
  for (const auto& [id, r] : c.readers) {
    if (r.slot >= 0 && (r.inside || now - r.left < away_wait())) least = std::min(least, r.passed);
  }
  return least;
}

// Waits while `me` is more than `lead` bytes ahead of the slowest reader to be waited for (re-checked
// every kRecheck, since a reader staying away wakes nobody), at most lead_wait(). Lock held.
void wait_for_slowest(Cache& c, std::unique_lock<std::mutex>& lock, const Reader& me, uint64_t lead) {
  const Clock::time_point deadline = Clock::now() + lead_wait();
  for (Clock::time_point now = Clock::now(); now < deadline; now = Clock::now()) {
    const uint64_t least = slowest_passed(c, now);
    if (least == UINT64_MAX || me.passed <= least + lead) return;
    c.cv.wait_for(lock, kRecheck);
  }
  g_lead_timeouts.fetch_add(1);
}

// This thread's reader, marked inside the cache, joined (given a slot, if one of the 64 is free) on
// its first read through the cache, with nothing passed yet: the ranks of a tp group start their
// loads together, so counts from 0 compare positions. (A rank that joins later holds the others
// back while it reads again the chunks they have passed.)
Reader& join(Cache& c) {
  std::lock_guard lock(c.m);
  Reader& me = c.readers.at(std::this_thread::get_id());
  me.inside = true;
  if (me.slot >= 0) return me;
  for (int s = 0; s < 64; ++s) {
    if (c.joined & (uint64_t{1} << s)) continue;
    me.slot = s;
    c.joined |= uint64_t{1} << s;
    break;
  }
  return me;
}

// Reads the claimed chunks `mine` (O_DIRECT, `requests` in flight), marks them ready and wakes the
// ranks waiting for them; a failed chunk leaves the cache and its error goes to every waiter and
// is returned. With `failed` set, the chunks are not read but fail with it.
using Claimed = std::vector<std::pair<uint64_t, std::shared_ptr<Entry>>>;  // (chunk index, entry)

std::exception_ptr read_claimed(const fs::path& path, Key key, const Claimed& mine, uint64_t chunk, int requests,
                                size_t piece, std::exception_ptr failed = nullptr) {
  if (mine.empty()) return failed;
  Cache& c = cache();
  std::exception_ptr error = failed;
  if (!error) {
    std::vector<ReadRange> reads;
    for (const auto& [k, e] : mine) reads.push_back({k * chunk, e->buf.p, e->n});
    try {
      pread_ranges_direct(FileHandle(path, O_RDONLY), reads, requests, piece);
    } catch (...) {
      error = std::current_exception();
    }
  }
  {
    std::lock_guard lock(c.m);
    for (const auto& [k, e] : mine) {
      e->ready = true;
      e->error = error;
      if (!error) g_read.fetch_add(e->n);
      key.chunk = k;
      auto it = c.entries.find(key);
      if (error && it != c.entries.end() && it->second == e) {  // nobody keeps a failed chunk
        c.held -= it->second->buf.cap;
        c.entries.erase(it);
      }
    }
  }
  c.cv.notify_all();
  return error;
}

// Chunks [first, last] (of `chunk` bytes) of the file `key` names: claims the ones nobody has yet
// and reads them, waits for the others, and copies each range's part of each chunk. Chunks
// (last, ahead] nobody has yet are claimed too and read after this window's, before copying: the
// next tensor in the file is usually the next one loaded, so the disk keeps busy while the ranks copy.
//
// `span` is the bytes [lo, hi) this call's ranges cover; the reader has passed `before` bytes of
// earlier spans. Before claiming, a reader more than the cache can hold ahead of the slowest joined
// reader waits for it (holding no claim, so nobody waits for this one): on 4 rank threads sharing 2
// cores one rank can fall behind by more than the cache, and would find the chunks it still needs
// evicted and read them again. The wait is bounded (span_lead_wait_ms): it only shapes the order, the bytes
// do not depend on it.
void fill_from_chunks(const fs::path& path, Key key, uint64_t file_size, uint64_t chunk, uint64_t first, uint64_t last,
                      uint64_t ahead, std::span<const ReadRange> ranges, int requests, size_t piece, Reader& me,
                      std::pair<uint64_t, uint64_t> span, uint64_t before) {
  Cache& c = cache();
  std::vector<std::shared_ptr<Entry>> chunks;
  Claimed mine, mine_ahead;
  std::exception_ptr error;  // a buffer that could not be mapped: the chunks claimed so far fail
  {
    std::unique_lock lock(c.m);
    const uint64_t room = std::max<uint64_t>(load_tuning().span_cache_bytes / chunk, 1), need = ahead - first + 1;
    // The slowest still needs the chunk it is in and those up to this one's; spans do not start on
    // chunk boundaries: one chunk more.
    const uint64_t lead = room > need + 1 ? (room - need - 1) * chunk : 0;
    if (me.slot >= 0) wait_for_slowest(c, lock, me, lead);
    try {
      for (uint64_t k = first; k <= ahead; ++k) {
        key.chunk = k;
        auto it = c.entries.find(key);
        if (it == c.entries.end()) {
          evict_for(c, chunk, load_tuning().span_cache_bytes);
          auto entry = std::make_shared<Entry>(take_buffer(chunk), static_cast<size_t>(std::min(chunk, file_size - k * chunk)));
          it = c.entries.emplace(key, std::move(entry)).first;
          c.held += chunk;
          (k <= last ? mine : mine_ahead).emplace_back(k, it->second);
        }
        it->second->used = ++c.tick;
        if (k <= last) chunks.push_back(it->second);
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  error = read_claimed(path, key, mine, chunk, requests, piece, error);
  read_claimed(path, key, mine_ahead, chunk, requests, piece, error);  // its own error is its waiters'
  if (error) std::rethrow_exception(error);
  for (size_t i = 0; i < chunks.size(); ++i) {  // in file order, each as soon as it is read
    const Entry& e = *chunks[i];
    {
      std::unique_lock lock(c.m);
      c.cv.wait(lock, [&] { return e.ready; });
    }
    if (e.error) std::rethrow_exception(e.error);
    const uint64_t base = (first + i) * chunk, end = base + e.n;
    for (const ReadRange& r : ranges) {
      const uint64_t a = std::max(r.offset, base), b = std::min(r.offset + r.n, end);
      if (a < b) std::memcpy(r.dst + (a - r.offset), e.buf.p + (a - base), static_cast<size_t>(b - a));
    }
    {
      std::lock_guard lock(c.m);
      if (me.slot >= 0) chunks[i]->served |= uint64_t{1} << me.slot;
      me.passed = before + std::min(end, span.second) - span.first;
    }
    c.cv.notify_all();  // a reader waiting for this one to catch up
  }
}

}  // namespace

bool read_through_span_cache(const fs::path& path, uint64_t file_size, std::span<const ReadRange> ranges,
                             int requests, size_t piece) {
  const LoadTuning& tuning = load_tuning();
  const uint64_t chunk = std::max(tuning.span_chunk / kDirectAlign * kDirectAlign, kDirectAlign);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const ReadRange& r : ranges) {
    if (r.n == 0) continue;
    lo = std::min(lo, r.offset);
    hi = std::max(hi, r.offset + r.n);
  }
  if (hi <= lo) return true;
  SW_CHECK(hi <= file_size, "checkpoint load: bytes [{}, {}) asked of '{}', which has {}", lo, hi, path.string(),
           file_size);
  if (!FileHandle::open_direct(path, O_RDONLY)) return false;  // no direct I/O here: the caller's page-cache path
  const Key key = file_key(path);
  SpanCacheUse hold;  // a reader outside load_group still frees what it cached when it ends last
  Reader& me = join(cache());
  struct Leave {  // before `hold` ends (which may drop the reader)
    Reader& r;
    ~Leave() {
      {
        std::lock_guard lock(cache().m);
        r.inside = false;
        r.left = Clock::now();
      }
      cache().cv.notify_all();
    }
  } leave{me};
  const uint64_t before = me.passed;  // only this thread changes it
  // A window of a quarter of the cache at a time (several ranks hold windows at once), so a span
  // larger than the cache stays within it.
  const uint64_t window = std::max<uint64_t>(tuning.span_cache_bytes / 4 / chunk, 1);
  const uint64_t first = lo / chunk, last = (hi - 1) / chunk;
  const uint64_t file_last = (file_size - 1) / chunk;
  for (uint64_t k = first; k <= last; k += window) {
    const uint64_t end = std::min(last, k + window - 1);
    const uint64_t ahead = end == last && tuning.span_read_ahead ? std::min(file_last, last + window) : end;
    fill_from_chunks(path, key, file_size, chunk, k, end, ahead, ranges, requests, piece, me, {lo, hi}, before);
  }
  return true;
}

}  // namespace shardwise::ckpt
