#include "collective_checks.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "shardwise/comm/objects.h"
#include "shardwise/core/error.h"

namespace shardwise::comm::checks {
namespace {

// Rank r's element i: distinct per rank and element, signed, exact in float.
double value(int r, int64_t i) { return (r % 2 ? -1.0 : 1.0) * ((r + 1) * 100.0 + static_cast<double>(i % 97)); }

template <class T>
std::vector<T> values(int r, int64_t n, int64_t first = 0) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<T>(value(r, first + i));
  return v;
}

double reduce_expected(Reduce op, int n, int64_t i) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i);
    switch (op) {
      case Reduce::Sum: case Reduce::Avg: acc += v; break;
      case Reduce::Prod: acc *= v; break;
      case Reduce::Max: acc = std::max(acc, v); break;
      case Reduce::Min: acc = std::min(acc, v); break;
    }
  }
  return op == Reduce::Avg ? acc / n : acc;
}

void expect(bool ok, const char* op, Communicator& c, int64_t i, double got, double want) {
  if (!ok) fail("{} on rank {} of {} ({}): element {} is {}, expected {}", op, c.rank(), c.size(), c.backend(), i, got, want);
}

void expect_near(const char* op, Communicator& c, int64_t i, double got, double want) {
  expect(std::abs(got - want) <= 1e-9 * std::max(1.0, std::abs(want)), op, c, i, got, want);
}

constexpr Reduce kOps[] = {Reduce::Sum, Reduce::Avg, Reduce::Max, Reduce::Min, Reduce::Prod};

// Unequal counts: rank r has (r * 3 + 1) % 5 elements, so some ranks have none at sizes >= 4.
std::vector<int64_t> unequal_counts(int n) {
  std::vector<int64_t> c(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) c[static_cast<size_t>(r)] = (r * 3 + 1) % 5;
  return c;
}

}  // namespace

void all_reduce_every_op(Communicator& c) {
  const int64_t n = 37;
  for (Reduce op : kOps) {
    std::vector<double> in = values<double>(c.rank(), n), out(n);
    c.all_reduce(in.data(), out.data(), n, DType::F64, op);
    for (int64_t i = 0; i < n; ++i) expect_near("all_reduce f64", c, i, out[static_cast<size_t>(i)], reduce_expected(op, c.size(), i));
    // In place, float32 (sum of small integers is exact).
    std::vector<float> f = values<float>(c.rank(), n);
    c.all_reduce(f.data(), f.data(), n, DType::F32, op);
    for (int64_t i = 0; i < n; ++i) {
      double want = reduce_expected(op, c.size(), i);
      expect(std::abs(f[static_cast<size_t>(i)] - want) <= 1e-6 * std::max(1.0, std::abs(want)), "all_reduce f32 in place", c, i,
             f[static_cast<size_t>(i)], want);
    }
  }
  std::vector<int32_t> ints = values<int32_t>(c.rank(), 5);
  c.all_reduce(ints.data(), ints.data(), 5, DType::I32, Reduce::Max);
  for (int64_t i = 0; i < 5; ++i) expect(ints[static_cast<size_t>(i)] == reduce_expected(Reduce::Max, c.size(), i), "all_reduce i32", c, i, ints[static_cast<size_t>(i)], reduce_expected(Reduce::Max, c.size(), i));
  c.all_reduce(nullptr, nullptr, 0, DType::F32, Reduce::Sum);  // zero elements
}

void reduce_to_every_root(Communicator& c) {
  const int64_t n = 11;
  for (int root = 0; root < c.size(); ++root) {
    for (Reduce op : {Reduce::Sum, Reduce::Min}) {
      std::vector<double> in = values<double>(c.rank(), n), out(n, -7.0);
      c.reduce(in.data(), out.data(), n, DType::F64, op, root);
      for (int64_t i = 0; i < n; ++i) {
        double want = c.rank() == root ? reduce_expected(op, c.size(), i) : -7.0;  // untouched off root
        expect_near("reduce", c, i, out[static_cast<size_t>(i)], want);
      }
    }
  }
}

void broadcast_from_every_root(Communicator& c) {
  for (int root = 0; root < c.size(); ++root) {
    std::vector<int64_t> buf = values<int64_t>(c.rank(), 9);
    c.broadcast(buf.data(), 9, DType::I64, root);
    for (int64_t i = 0; i < 9; ++i) expect(buf[static_cast<size_t>(i)] == value(root, i), "broadcast", c, i, buf[static_cast<size_t>(i)], value(root, i));
    Tensor t = Tensor::full(DType::F32, Shape{2, 3}, c.rank());
    c.broadcast(t, root);
    for (int64_t i = 0; i < 6; ++i) expect(t.at(i) == root, "broadcast tensor", c, i, t.at(i), root);
  }
  c.broadcast(nullptr, 0, DType::F32, 0);
}

void all_gather_equal_and_unequal(Communicator& c) {
  const int64_t n = 6;
  std::vector<float> in = values<float>(c.rank(), n), out(static_cast<size_t>(n * c.size()));
  c.all_gather(in.data(), out.data(), n, DType::F32);
  for (int r = 0; r < c.size(); ++r)
    for (int64_t i = 0; i < n; ++i) expect(out[static_cast<size_t>(r * n + i)] == value(r, i), "all_gather", c, r * n + i, out[static_cast<size_t>(r * n + i)], value(r, i));
  std::vector<int64_t> counts = unequal_counts(c.size());
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<double> vin = values<double>(c.rank(), counts[static_cast<size_t>(c.rank())]), vout(static_cast<size_t>(total), -1);
  c.all_gather_v(vin.data(), vout.data(), counts, DType::F64);
  int64_t at = 0;
  for (int r = 0; r < c.size(); ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i, ++at) expect(vout[static_cast<size_t>(at)] == value(r, i), "all_gather_v", c, at, vout[static_cast<size_t>(at)], value(r, i));
  std::vector<int64_t> zeros(static_cast<size_t>(c.size()), 0);
  c.all_gather_v(nullptr, nullptr, zeros, DType::F32);
}

void reduce_scatter_equal_and_unequal(Communicator& c) {
  const int64_t n = 5;
  for (Reduce op : kOps) {
    std::vector<double> in = values<double>(c.rank(), n * c.size()), out(n);
    c.reduce_scatter(in.data(), out.data(), n, DType::F64, op);
    for (int64_t i = 0; i < n; ++i) expect_near("reduce_scatter", c, i, out[static_cast<size_t>(i)], reduce_expected(op, c.size(), c.rank() * n + i));
  }
  std::vector<int64_t> counts = unequal_counts(c.size());
  int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  int64_t first = std::accumulate(counts.begin(), counts.begin() + c.rank(), int64_t{0});
  std::vector<double> in = values<double>(c.rank(), total), out(static_cast<size_t>(counts[static_cast<size_t>(c.rank())]));
  c.reduce_scatter_v(in.data(), out.data(), counts, DType::F64, Reduce::Sum);
  for (int64_t i = 0; i < counts[static_cast<size_t>(c.rank())]; ++i)
    expect_near("reduce_scatter_v", c, i, out[static_cast<size_t>(i)], reduce_expected(Reduce::Sum, c.size(), first + i));
}

void all_to_all_equal_and_v(Communicator& c) {
  const int n = c.size(), me = c.rank();
  // Equal: block p of rank q holds value(q, p * 4 + i).
  std::vector<int32_t> in = values<int32_t>(me, 4 * n), out(static_cast<size_t>(4 * n));
  c.all_to_all(in.data(), out.data(), 4, DType::I32);
  for (int p = 0; p < n; ++p)
    for (int i = 0; i < 4; ++i) expect(out[static_cast<size_t>(p * 4 + i)] == value(p, me * 4 + i), "all_to_all", c, p * 4 + i, out[static_cast<size_t>(p * 4 + i)], value(p, me * 4 + i));
  // Unequal: rank q sends (q + 2p) % 3 elements to p (zero for some pairs).
  auto count = [](int from, int to) { return int64_t((from + 2 * to) % 3); };
  std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) send[static_cast<size_t>(p)] = count(me, p), recv[static_cast<size_t>(p)] = count(p, me);
  // The elements rank q sends to p are value(q, 10 * p + i).
  std::vector<double> vin, vout(static_cast<size_t>(std::accumulate(recv.begin(), recv.end(), int64_t{0})), -1);
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < send[static_cast<size_t>(p)]; ++i) vin.push_back(value(me, 10 * p + i));
  c.all_to_all_v(vin.data(), send, vout.data(), recv, DType::F64);
  int64_t at = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t i = 0; i < recv[static_cast<size_t>(p)]; ++i, ++at) expect(vout[static_cast<size_t>(at)] == value(p, 10 * me + i), "all_to_all_v", c, at, vout[static_cast<size_t>(at)], value(p, 10 * me + i));
  std::vector<int64_t> zeros(static_cast<size_t>(n), 0);
  c.all_to_all_v(nullptr, zeros, nullptr, zeros, DType::F32);  // all-zero
}

void all_to_all_pieces_scattered(Communicator& c) {
  const int n = c.size(), me = c.rank();
  // Rank q sends (q + 2p) % 4 elements to p (zero for some pairs), value(q, 10 * p + i), in pieces
  // of 2, 1 (the last one cut short) and an empty one, which both ends name alike.
  auto count = [](int from, int to) { return int64_t((from + 2 * to) % 4); };
  auto sizes = [](int64_t total) {
    std::vector<int64_t> v;
    for (int64_t done = 0, k = 0; done < total; done += v.back(), ++k) v.push_back(std::min<int64_t>(k % 2 ? 1 : 2, total - done));
    v.push_back(0);
    return v;
  };
  // Send side: peers in reverse order in the buffer, a gap before each piece.
  std::vector<int64_t> sf{0}, so, sc, rf{0}, ro, rc;
  std::vector<float> in(static_cast<size_t>(8 * n), -1.0f);
  for (int p = 0; p < n; ++p) {
    int64_t at = 8 * (n - 1 - p), i = 0;
    for (int64_t len : sizes(count(me, p))) {
      ++at;  // a gap
      so.push_back(at), sc.push_back(len);
      for (int64_t j = 0; j < len; ++j, ++i) in[static_cast<size_t>(at + j)] = static_cast<float>(value(me, 10 * p + i));
      at += len;
    }
    sf.push_back(static_cast<int64_t>(so.size()));
  }
  // Receive side: piece k from peer q in slot k * n + q of 3 elements, slots from the buffer's end
  // backwards (peers interleaved).
  std::vector<float> out(static_cast<size_t>(9 * n), -1.0f);
  for (int q = 0; q < n; ++q) {
    int64_t k = 0;
    for (int64_t len : sizes(count(q, me))) ro.push_back(3 * (3 * n - 1 - (k++ * n + q))), rc.push_back(len);
    rf.push_back(static_cast<int64_t>(ro.size()));
  }
  c.all_to_all_pieces(in.data(), Pieces{sf, so, sc}, out.data(), Pieces{rf, ro, rc}, DType::F32);
  std::vector<bool> written(out.size(), false);
  for (int q = 0; q < n; ++q) {
    int64_t i = 0;
    for (auto k = static_cast<size_t>(rf[static_cast<size_t>(q)]); k < static_cast<size_t>(rf[static_cast<size_t>(q) + 1]); ++k) {
      for (int64_t j = 0; j < rc[k]; ++j, ++i) {
        const auto at = static_cast<size_t>(ro[k] + j);
        written[at] = true;
        expect(out[at] == static_cast<float>(value(q, 10 * me + i)), "all_to_all_pieces", c, static_cast<int64_t>(at),
               out[at], value(q, 10 * me + i));
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (!written[i]) expect(out[i] == -1.0f, "all_to_all_pieces (outside the pieces)", c, static_cast<int64_t>(i), out[i], -1.0);
  }
  // No pieces at all, and only empty pieces.
  std::vector<int64_t> none(static_cast<size_t>(n + 1), 0), one_each(static_cast<size_t>(n + 1)), zeros(static_cast<size_t>(n), 0);
  std::iota(one_each.begin(), one_each.end(), int64_t{0});
  c.all_to_all_pieces(nullptr, Pieces{none, {}, {}}, nullptr, Pieces{none, {}, {}}, DType::F64);
  c.all_to_all_pieces(in.data(), Pieces{one_each, zeros, zeros}, out.data(), Pieces{one_each, zeros, zeros}, DType::F32);
}

void all_to_all_pieces_filled(Communicator& c) {
  const int n = c.size(), me = c.rank();
  // Rank q sends q + p + 1 elements to p in one piece, value(q, 10 * p + i), written only when
  // fill(p) is called; its own piece travels as empty and fill(me) writes it straight into out.
  auto count = [](int from, int to) { return int64_t(from + to + 1); };
  std::vector<int64_t> sf{0}, so, sc, rf{0}, ro, rc;
  int64_t at = 0;
  for (int p = 0; p < n; ++p) {
    so.push_back(at), sc.push_back(p == me ? 0 : count(me, p)), sf.push_back(p + 1);
    at += count(me, p);
  }
  std::vector<float> in(static_cast<size_t>(at), -1.0f);
  at = 0;
  for (int q = 0; q < n; ++q) {
    ro.push_back(at), rc.push_back(q == me ? 0 : count(q, me)), rf.push_back(q + 1);
    at += count(q, me);
  }
  std::vector<float> out(static_cast<size_t>(at), -1.0f);
  std::vector<int> calls;
  auto fill = [&](int p) {
    calls.push_back(p);
    float* to = p == me ? out.data() + ro[static_cast<size_t>(me)] : in.data() + so[static_cast<size_t>(p)];
    for (int64_t i = 0; i < count(me, p); ++i) to[i] = static_cast<float>(value(me, 10 * p + i));
  };
  c.all_to_all_pieces(in.data(), Pieces{sf, so, sc}, out.data(), Pieces{rf, ro, rc}, DType::F32, fill);
  std::vector<int> sorted = calls;
  std::sort(sorted.begin(), sorted.end());
  for (int p = 0; p < n; ++p) {
    const int got = static_cast<size_t>(p) < sorted.size() ? sorted[static_cast<size_t>(p)] : -1;
    expect(got == p && sorted.size() == static_cast<size_t>(n), "all_to_all_pieces (fill once per rank)", c, p, got, p);
  }
  expect(!calls.empty() && calls.back() == me, "all_to_all_pieces (fill of this rank last)", c, 0,
         calls.empty() ? -1 : calls.back(), me);
  for (int q = 0; q < n; ++q) {
    for (int64_t i = 0; i < count(q, me); ++i) {
      const auto k = static_cast<size_t>(ro[static_cast<size_t>(q)] + i);
      expect(out[k] == static_cast<float>(value(q, 10 * me + i)), "all_to_all_pieces (filled)", c, static_cast<int64_t>(k),
             out[k], value(q, 10 * me + i));
    }
  }
}

void send_recv_ring_and_tags(Communicator& c) {
  const int n = c.size(), me = c.rank();
  if (n == 1) return;
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Even ranks send first, odd ranks receive first: no deadlock even with blocking sends.
  std::vector<float> mine = values<float>(me, 8), got(8);
  std::vector<int64_t> tagged = {me * 7, me * 7 + 1}, tagged_got(2);
  auto do_send = [&] {
    c.send(mine.data(), 8, DType::F32, next, 3);
    c.send(tagged.data(), 2, DType::I64, next, 5);
  };
  auto do_recv = [&] {
    c.recv(got.data(), 8, DType::F32, prev, 3);
    c.recv(tagged_got.data(), 2, DType::I64, prev, 5);
  };
  if (me % 2 == 0) do_send(), do_recv();
  else do_recv(), do_send();
  for (int64_t i = 0; i < 8; ++i) expect(got[static_cast<size_t>(i)] == value(prev, i), "recv", c, i, got[static_cast<size_t>(i)], value(prev, i));
  expect(tagged_got[0] == prev * 7 && tagged_got[1] == prev * 7 + 1, "recv (tag 5)", c, 0, tagged_got[0], prev * 7);
  c.barrier();
  // Zero-size message.
  if (me == 0) c.send(nullptr, 0, DType::F32, 1, 9);
  if (me == 1) c.recv(nullptr, 0, DType::F32, 0, 9);
  c.barrier();
}

void started_send_recv(Communicator& c, bool waits_in_any_order) {
  const int n = c.size(), me = c.rank();
  if (n == 1) return;
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Messages to the next rank: two on tag 3 (5 and 1000 elements), one on tag 4 (3 integers),
  // one beyond an eager size on tag 6, an empty one on tag 8. The receives are posted tag 4 first,
  // then tag 3's in order (they meet the messages in order), the large one and the empty one.
  const int64_t big = 300 * 1000;
  std::vector<float> a = values<float>(me, 5), b = values<float>(me, 1000, 7), large = values<float>(me, big, 11);
  std::vector<int64_t> ints = {me * 7, me * 7 + 1, me * 7 + 2};
  std::vector<float> got_a(5, -1), got_b(1000, -1), got_large(static_cast<size_t>(big), -1);
  std::vector<int64_t> got_ints(3, -1);
  std::vector<std::unique_ptr<Request>> receives, sends;
  auto post = [&] {
    receives.push_back(c.start_recv(got_ints.data(), 3, DType::I64, prev, 4));
    receives.push_back(c.start_recv(got_a.data(), 5, DType::F32, prev, 3));
    receives.push_back(c.start_recv(got_b.data(), 1000, DType::F32, prev, 3));
    receives.push_back(c.start_recv(got_large.data(), big, DType::F32, prev, 6));
    receives.push_back(c.start_recv(nullptr, 0, DType::F32, prev, 8));
  };
  auto start = [&] {
    sends.push_back(c.start_send(a.data(), 5, DType::F32, next, 3));
    sends.push_back(c.start_send(b.data(), 1000, DType::F32, next, 3));
    sends.push_back(c.start_send(large.data(), big, DType::F32, next, 6));
    sends.push_back(c.start_send(ints.data(), 3, DType::I64, next, 4));
    sends.push_back(c.start_send(nullptr, 0, DType::F32, next, 8));
  };
  auto wait_all = [](std::vector<std::unique_ptr<Request>>& requests, bool reversed) {
    if (reversed) std::reverse(requests.begin(), requests.end());
    for (auto& r : requests) r->wait();
    for (auto& r : requests) {
      if (!r->test()) fail("a request waited for is not done");
    }
  };
  if (waits_in_any_order) {
    // Every rank posts and starts everything, then waits for its receives (last first), then its sends.
    post(), start();
    // A blocking recv on a tag whose started receive is still pending meets the message after it.
    std::vector<double> first(2, -1), second(2, -1), mine = {me + 0.5, me + 0.25};
    auto pending = c.start_recv(first.data(), 2, DType::F64, prev, 9);
    auto s1 = c.start_send(mine.data(), 1, DType::F64, next, 9), s2 = c.start_send(mine.data() + 1, 1, DType::F64, next, 9);
    c.recv(second.data(), 1, DType::F64, prev, 9);
    expect(second[0] == prev + 0.25, "recv after a started recv", c, 0, second[0], prev + 0.25);
    // (the pending receive expects 2 elements; its message has 1: an Error at its wait)
    bool refused = false;
    try {
      pending->wait();
    } catch (const Error&) {
      refused = true;
    }
    if (!refused) fail("start_recv on rank {} ({}): a message of another size was not an Error", me, c.backend());
    s1->wait(), s2->wait();
    wait_all(receives, true);
    wait_all(sends, false);
  } else {
    // The default makes each call at its wait: waits in an order safe for blocking calls, each
    // channel's receives in the order they were posted.
    post(), start();
    if (me % 2 == 0) wait_all(sends, false), wait_all(receives, false);
    else wait_all(receives, false), wait_all(sends, false);
  }
  for (int64_t i = 0; i < 5; ++i) expect(got_a[static_cast<size_t>(i)] == value(prev, i), "start_recv (tag 3, first)", c, i, got_a[static_cast<size_t>(i)], value(prev, i));
  for (int64_t i = 0; i < 1000; ++i) expect(got_b[static_cast<size_t>(i)] == value(prev, 7 + i), "start_recv (tag 3, second)", c, i, got_b[static_cast<size_t>(i)], value(prev, 7 + i));
  for (int64_t i = 0; i < big; i += 997) expect(got_large[static_cast<size_t>(i)] == value(prev, 11 + i), "start_recv (large)", c, i, got_large[static_cast<size_t>(i)], value(prev, 11 + i));
  expect(got_large.back() == value(prev, 11 + big - 1), "start_recv (large)", c, big - 1, got_large.back(), value(prev, 11 + big - 1));
  for (int64_t i = 0; i < 3; ++i) expect(got_ints[static_cast<size_t>(i)] == prev * 7 + i, "start_recv (tag 4)", c, i, static_cast<double>(got_ints[static_cast<size_t>(i)]), static_cast<double>(prev * 7 + i));
  c.barrier();
}

void objects_and_bytes(Communicator& c) {
  nlohmann::json mine = {{"rank", c.rank()},
                         {"name", fmt::format("r{}", c.rank())},
                         {"list", {1.5, "two", nullptr, {{"nested", true}}}},
                         {"map", {{"a", c.rank() * 2}}}};
  for (int root = 0; root < c.size(); ++root) {
    nlohmann::json got = broadcast_object(c, mine, root);
    if (got["rank"] != root || got["name"] != fmt::format("r{}", root) || got["list"][3]["nested"] != true)
      fail("broadcast_object on rank {}: got {}", c.rank(), got.dump());
  }
  auto all = all_gather_object(c, mine);
  if (static_cast<int>(all.size()) != c.size()) fail("all_gather_object: {} objects for {} ranks", all.size(), c.size());
  for (int r = 0; r < c.size(); ++r)
    if (all[static_cast<size_t>(r)]["map"]["a"] != r * 2) fail("all_gather_object on rank {}: object {} is {}", c.rank(), r, all[static_cast<size_t>(r)].dump());
  // Bytes of different lengths, one of them empty.
  std::vector<std::byte> bytes(static_cast<size_t>(c.rank() * 3), std::byte{static_cast<unsigned char>(c.rank())});
  auto gathered = c.all_gather_bytes(bytes);
  for (int r = 0; r < c.size(); ++r)
    if (gathered[static_cast<size_t>(r)].size() != static_cast<size_t>(r * 3)) fail("all_gather_bytes on rank {}: {} bytes from rank {}", c.rank(), gathered[static_cast<size_t>(r)].size(), r);
}

void sub_groups(Communicator& c) {
  // Two groups: even ranks and odd ranks (in reverse order, to check group-rank order).
  std::vector<int> evens, odds;
  for (int r = 0; r < c.size(); ++r) (r % 2 ? odds : evens).push_back(c.members()[static_cast<size_t>(r)]);
  std::reverse(odds.begin(), odds.end());
  auto g = c.group(c.rank() % 2 ? odds : evens);
  const auto& mine = c.rank() % 2 ? odds : evens;
  int64_t id = c.members()[static_cast<size_t>(c.rank())], sum = 0;
  g->all_reduce(&id, &sum, 1, DType::I64, Reduce::Sum);
  int64_t want = std::accumulate(mine.begin(), mine.end(), int64_t{0});
  expect(sum == want, "sub-group all_reduce", c, 0, double(sum), double(want));
  std::vector<int64_t> order(mine.size());
  g->all_gather(&id, order.data(), 1, DType::I64);
  for (size_t i = 0; i < mine.size(); ++i) expect(order[i] == mine[i], "sub-group member order", c, int64_t(i), double(order[i]), mine[i]);
  // A mesh [n] communicator along its only dim is the whole group.
  MeshComm mc(mesh::ProcessMesh(Shape{c.size()}, [&] {
                std::vector<int64_t> ids(c.members().begin(), c.members().end());
                return ids;
              }()),
              c.group(c.members()));
  int64_t one = 1, n = 0;
  mc.along(0).all_reduce(&one, &n, 1, DType::I64, Reduce::Sum);
  expect(n == c.size(), "MeshComm along 0", c, 0, double(n), c.size());
}

void started_collectives(Communicator& c) {
  const int64_t n = 29;
  std::vector<std::vector<double>> in, out;
  std::vector<std::vector<float>> inplace;
  std::vector<std::unique_ptr<Request>> requests;
  for (Reduce op : kOps) {
    in.push_back(values<double>(c.rank(), n));
    out.emplace_back(n, -1.0);
    requests.push_back(c.start_all_reduce(in.back().data(), out.back().data(), n, DType::F64, op));
    inplace.push_back(values<float>(c.rank(), n));
    requests.push_back(c.start_all_reduce(inplace.back().data(), inplace.back().data(), n, DType::F32, op));
  }
  std::vector<int64_t> counts = unequal_counts(c.size());
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const int64_t first = std::accumulate(counts.begin(), counts.begin() + c.rank(), int64_t{0});
  std::vector<float> rs_in = values<float>(c.rank(), total), rs_out(static_cast<size_t>(counts[static_cast<size_t>(c.rank())]));
  requests.push_back(c.start_reduce_scatter_v(rs_in.data(), rs_out.data(), counts, DType::F32, Reduce::Sum));
  // Rank r gives counts[r] elements r * 1000 + i; every rank gets them all, packed.
  std::vector<float> ag_in(static_cast<size_t>(counts[static_cast<size_t>(c.rank())])), ag_out(static_cast<size_t>(total), -1.0f);
  for (size_t i = 0; i < ag_in.size(); ++i) ag_in[i] = static_cast<float>(c.rank() * 1000 + static_cast<int64_t>(i));
  requests.push_back(c.start_all_gather_v(ag_in.data(), ag_out.data(), counts, DType::F32));
  int64_t one = 1, ranks = 0;  // a blocking collective while the others are started
  c.all_reduce(&one, &ranks, 1, DType::I64, Reduce::Sum);
  expect(ranks == c.size(), "all_reduce between starts and waits", c, 0, double(ranks), c.size());
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) (*it)->wait();
  for (auto& r : requests) {
    r->wait();  // again: returns at once
    expect(r->test(), "test after wait", c, 0, 0, 1);
  }
  for (size_t k = 0; k < std::size(kOps); ++k) {
    for (int64_t i = 0; i < n; ++i) {
      const double want = reduce_expected(kOps[k], c.size(), i);
      expect_near("start_all_reduce f64", c, i, out[k][static_cast<size_t>(i)], want);
      const float got = inplace[k][static_cast<size_t>(i)];
      expect(std::abs(got - want) <= 1e-6 * std::max(1.0, std::abs(want)), "start_all_reduce f32 in place", c, i, got, want);
    }
  }
  for (int64_t i = 0; i < counts[static_cast<size_t>(c.rank())]; ++i)
    expect_near("start_reduce_scatter_v", c, i, rs_out[static_cast<size_t>(i)], reduce_expected(Reduce::Sum, c.size(), first + i));
  int64_t at = 0;
  for (int r = 0; r < c.size(); ++r) {
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i, ++at)
      expect(ag_out[static_cast<size_t>(at)] == static_cast<float>(r * 1000 + i), "start_all_gather_v", c, at,
             ag_out[static_cast<size_t>(at)], r * 1000 + i);
  }
}

void shared_regions(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const SharedRegions first = c.shared_regions(100);
  if (c.backend() == "nccl") {  // GPU memory is not shared this way
    if (first) fail("shared_regions on rank {} ({}): regions where the backend has none", me, c.backend());
    return;
  }
  // Every member writes its own slot of every region, a barrier, every member reads every slot of
  // every region (the tests run on one node).
  auto exchange = [&](const SharedRegions& s, int64_t asked, int64_t round) {
    if (static_cast<int>(s.at.size()) != n || s.bytes < asked) {
      fail("shared_regions on rank {} ({}): {} regions of {} bytes for {} members asking {}", me, c.backend(),
           s.at.size(), s.bytes, n, asked);
    }
    const int64_t slots = asked / static_cast<int64_t>(sizeof(int64_t)), per = slots / n;  // each member's share
    for (int p = 0; p < n; ++p) {
      const auto at = reinterpret_cast<uintptr_t>(s.at[static_cast<size_t>(p)]);
      if (at % 64) fail("shared_regions on rank {} ({}): region {} at {:#x} is not 64-byte aligned", me, c.backend(), p, at);
      for (int q = 0; q < n; ++q) {
        if (q != p && at < reinterpret_cast<uintptr_t>(s.at[static_cast<size_t>(q)]) + static_cast<uintptr_t>(s.bytes) &&
            reinterpret_cast<uintptr_t>(s.at[static_cast<size_t>(q)]) < at + static_cast<uintptr_t>(s.bytes)) {
          fail("shared_regions on rank {} ({}): regions {} and {} overlap", me, c.backend(), p, q);
        }
      }
      auto* slot = reinterpret_cast<int64_t*>(s.at[static_cast<size_t>(p)]) + me * per;
      for (int64_t i = 0; i < per; ++i) slot[i] = round * 1000000 + (p * 100 + me) * 1000 + i % 1000;
    }
    c.shared_barrier();
    for (int p = 0; p < n; ++p) {
      for (int q = 0; q < n; ++q) {
        const auto* slot = reinterpret_cast<const int64_t*>(s.at[static_cast<size_t>(p)]) + q * per;
        for (int64_t i = 0; i < per; ++i) {
          const int64_t want = round * 1000000 + (p * 100 + q) * 1000 + i % 1000;
          if (slot[i] != want) {
            fail("shared_regions on rank {} ({}): region {} holds {} where rank {} wrote {} (element {})", me,
                 c.backend(), p, slot[i], q, want, i);
          }
        }
      }
    }
    c.shared_barrier();  // every read done before the next round writes
  };
  exchange(first, 100, 1);
  const SharedRegions within = c.shared_regions(first.bytes);  // no growth: the same regions
  if (within.call != first.call + 1 || within.at.data() == nullptr || within.at[0] != first.at[0] || within.bytes != first.bytes) {
    fail("shared_regions on rank {} ({}): a call within the size moved the regions or miscounted calls ({} after {})", me,
         c.backend(), within.call, first.call);
  }
  exchange(within, first.bytes, 2);
  const int64_t big = 3 * first.bytes + 8 * 1024 * n;
  exchange(c.shared_regions(big), big, 3);  // grown on every member together
}

void all(Communicator& c) {
  all_reduce_every_op(c);
  reduce_to_every_root(c);
  broadcast_from_every_root(c);
  all_gather_equal_and_unequal(c);
  reduce_scatter_equal_and_unequal(c);
  all_to_all_equal_and_v(c);
  all_to_all_pieces_scattered(c);
  all_to_all_pieces_filled(c);
  send_recv_ring_and_tags(c);
  started_send_recv(c);
  objects_and_bytes(c);
  sub_groups(c);
  started_collectives(c);
  shared_regions(c);
}

}  // namespace shardwise::comm::checks
