// comm::RoutedComm over two threads-backend communicators of the same ranks, each wrapped in a
// counting communicator that logs every call it gets: a call under a DeviceBuffers scope (the fake
// device's buffers) lands on the device side only, every other call on the host side only, with
// the host path's bits either way; groups route alike; shared regions and the byte helpers are the
// host's; a CheckedByCaller scope on the routed communicator reaches the side; sides that are not
// the same group of ranks are refused, naming both.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_cases.h"
#include "shardwise/comm/local.h"
#include "shardwise/comm/routed.h"
#include "shardwise/core/error.h"
#include "shardwise/tensor/fake_device.h"
#include "tests/support/stream_races.h"

namespace shardwise::comm {
namespace {

const Device kFake = Device::cuda(5);

// One logged call: its name, its group's size, and what the calling thread had open.
struct Call {
  std::string name;
  int size = 0;
  bool device = false;   // a DeviceBuffers scope
  bool checked = false;  // a CheckedByCaller scope on the receiving communicator
};
using Log = std::vector<Call>;

// Forwards every virtual to `inner` and logs it in `log` (its groups log there too).
class Counting final : public Communicator {
 public:
  Counting(std::shared_ptr<Communicator> inner, std::shared_ptr<Log> log) : in_(std::move(inner)), log_(std::move(log)) {}
  std::string_view backend() const override { return in_->backend(); }
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  const std::vector<int>& members() const override { return in_->members(); }
  std::shared_ptr<Communicator> group(std::span<const int> r) override {
    return std::make_shared<Counting>(in_->group(r), log_);
  }
  void all_reduce(const void* i, void* o, int64_t n, DType t, Reduce op) override { on("all_reduce").all_reduce(i, o, n, t, op); }
  void reduce(const void* i, void* o, int64_t n, DType t, Reduce op, int root) override { on("reduce").reduce(i, o, n, t, op, root); }
  void broadcast(void* b, int64_t n, DType t, int root) override { on("broadcast").broadcast(b, n, t, root); }
  void all_gather(const void* i, void* o, int64_t n, DType t) override { on("all_gather").all_gather(i, o, n, t); }
  void all_gather_v(const void* i, void* o, std::span<const int64_t> n, DType t) override { on("all_gather_v").all_gather_v(i, o, n, t); }
  void reduce_scatter(const void* i, void* o, int64_t n, DType t, Reduce op) override { on("reduce_scatter").reduce_scatter(i, o, n, t, op); }
  void reduce_scatter_v(const void* i, void* o, std::span<const int64_t> n, DType t, Reduce op) override {
    on("reduce_scatter_v").reduce_scatter_v(i, o, n, t, op);
  }
  void all_to_all(const void* i, void* o, int64_t n, DType t) override { on("all_to_all").all_to_all(i, o, n, t); }
  void all_to_all_v(const void* i, std::span<const int64_t> s, void* o, std::span<const int64_t> r, DType t) override {
    on("all_to_all_v").all_to_all_v(i, s, o, r, t);
  }
  void all_to_all_pieces(const void* i, const Pieces& s, void* o, const Pieces& r, DType t, const FillPieces& f) override {
    on("all_to_all_pieces").all_to_all_pieces(i, s, o, r, t, f);
  }
  void send(const void* i, int64_t n, DType t, int peer, int tag) override { on("send").send(i, n, t, peer, tag); }
  void recv(void* o, int64_t n, DType t, int peer, int tag) override { on("recv").recv(o, n, t, peer, tag); }
  std::unique_ptr<Request> start_send(const void* i, int64_t n, DType t, int peer, int tag) override {
    return on("start_send").start_send(i, n, t, peer, tag);
  }
  std::unique_ptr<Request> start_recv(void* o, int64_t n, DType t, int peer, int tag) override {
    return on("start_recv").start_recv(o, n, t, peer, tag);
  }
  void barrier() override { on("barrier").barrier(); }
  SharedRegions shared_regions(int64_t bytes) override { return on("shared_regions").shared_regions(bytes); }
  void shared_barrier() override { on("shared_barrier").shared_barrier(); }
  void shared_exchange(int64_t bytes, const FillPieces& f) override { on("shared_exchange").shared_exchange(bytes, f); }
  std::unique_ptr<Request> start_all_reduce(const void* i, void* o, int64_t n, DType t, Reduce op) override {
    return on("start_all_reduce").start_all_reduce(i, o, n, t, op);
  }
  std::unique_ptr<Request> start_reduce_scatter_v(const void* i, void* o, std::span<const int64_t> n, DType t,
                                                  Reduce op) override {
    return on("start_reduce_scatter_v").start_reduce_scatter_v(i, o, n, t, op);
  }
  std::unique_ptr<Request> start_all_gather_v(const void* i, void* o, std::span<const int64_t> n, DType t) override {
    return on("start_all_gather_v").start_all_gather_v(i, o, n, t);
  }

 private:
  Communicator& on(const char* name) {
    log_->push_back({name, size(), DeviceBuffers::current() != nullptr, CheckedByCaller::active(this)});
    return *in_;
  }
  std::shared_ptr<Communicator> in_;
  std::shared_ptr<Log> log_;
};

// One rank's routed communicator and the logs of its two sides.
struct Routed {
  std::shared_ptr<Log> host = std::make_shared<Log>(), device = std::make_shared<Log>();
  std::shared_ptr<RoutedComm> comm;
  explicit Routed(Communicator& world)
      : comm(std::make_shared<RoutedComm>(std::make_shared<Counting>(world.group(world.members()), host),
                                          std::make_shared<Counting>(world.group(world.members()), device))) {}
  void clear() { host->clear(), device->clear(); }
};

// Every call of `log` was made with (`device`) or without a DeviceBuffers scope.
bool all_scoped(const Log& log, bool device) {
  for (const Call& c : log) {
    if (c.device != device) return false;
  }
  return true;
}

std::vector<float> floats(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

class Routing : public testing::Test {
 protected:
  void SetUp() override { fake_ = &register_fake_device({.index = 5}); }
  void TearDown() override { expect_no_stream_races(*fake_); }
  FakeDeviceMemory* fake_ = nullptr;
};

TEST_F(Routing, DeviceBufferCallsGoToTheDeviceSideAndTheRestToTheHostWithTheHostPathsBits) {
  for (int n = 2; n <= 3; ++n) {
    LocalWorld::run(n, [&](Communicator& world) {
      Routed r(world);
      EXPECT_EQ(r.comm->backend(), "local+local");
      for (const device_cases::Case& c : device_cases::cases()) {
        r.clear();
        const Tensor on_device = device_cases::run_case(*r.comm, c, kFake);
        EXPECT_TRUE(r.host->empty()) << c.name << ": " << r.host->front().name << " went to the host side";
        EXPECT_FALSE(r.device->empty()) << c.name;
        EXPECT_TRUE(all_scoped(*r.device, true)) << c.name;
        r.clear();
        const Tensor on_host = device_cases::run_case(*r.comm, c, Device::host());
        EXPECT_TRUE(r.device->empty()) << c.name << ": " << r.device->front().name << " went to the device side";
        EXPECT_FALSE(r.host->empty()) << c.name;
        EXPECT_TRUE(all_scoped(*r.host, false)) << c.name;
        ASSERT_EQ(on_device.nbytes(), on_host.nbytes()) << c.name;
        EXPECT_EQ(std::memcmp(on_device.raw(), on_host.raw(), on_host.nbytes()), 0) << c.name << " on " << n << " ranks";
      }
      EXPECT_GT(r.comm->routes().device.load(), 0);
      EXPECT_GT(r.comm->routes().host.load(), 0);
    });
  }
}

TEST_F(Routing, StartedCallsAndThePiecesExchangeGoWhereTheirBuffersAre) {
  LocalWorld::run(2, [&](Communicator& world) {
    Routed r(world);
    DeviceMemory& memory = device_memory(kFake);
    const Stream stream = memory.create_stream();
    Tensor d = to_device(Tensor::from<float>(Shape{4}, {1, 2, 3, 4}), kFake, stream);
    std::unique_ptr<Request> started;
    {
      DeviceBuffers scope(kFake, stream);
      started = r.comm->start_all_reduce(d.device_ptr(), d.device_ptr(), 4, DType::F32, Reduce::Sum);
    }
    started->wait();  // outside the scope: the device side's request keeps its start's buffers
    ASSERT_EQ(r.device->size(), 1u);
    EXPECT_EQ(r.device->front().name, "start_all_reduce");
    EXPECT_TRUE(r.host->empty());
    EXPECT_EQ(floats(to_host(d, stream)), (std::vector<float>{2, 4, 6, 8}));
    memory.destroy_stream(stream);
    // The other started forms and the pieces exchange, on host buffers: each once on the host side.
    r.clear();
    const int peer = 1 - world.rank();
    std::vector<float> in = {1, 2}, out(1);
    const std::vector<int64_t> ones = {1, 1};
    r.comm->start_reduce_scatter_v(in.data(), out.data(), ones, DType::F32, Reduce::Sum)->wait();
    EXPECT_EQ(out[0], 2 * in[static_cast<size_t>(world.rank())]);
    float mine = float(world.rank()), theirs = -1;
    auto received = r.comm->start_recv(&theirs, 1, DType::F32, peer);
    r.comm->start_send(&mine, 1, DType::F32, peer)->wait();
    received->wait();
    EXPECT_EQ(theirs, float(peer));
    const std::vector<int64_t> first = {0, 1, 2}, offset = {0, 1}, count = {1, 1};
    const Pieces pieces{first, offset, count};
    std::vector<float> got(2);
    r.comm->all_to_all_pieces(in.data(), pieces, got.data(), pieces, DType::F32);
    EXPECT_EQ(got[static_cast<size_t>(peer)], in[static_cast<size_t>(world.rank())]);
    std::vector<std::string> names;
    for (const Call& c : *r.host) names.push_back(c.name);
    EXPECT_EQ(names, (std::vector<std::string>{"start_reduce_scatter_v", "start_recv", "start_send", "all_to_all_pieces"}));
    EXPECT_TRUE(r.device->empty());
  });
}

TEST_F(Routing, GroupsRouteLikewiseAndCountInTheWorldsRoutes) {
  LocalWorld::run(4, [&](Communicator& world) {
    Routed r(world);
    const std::vector<int> pair = world.rank() < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    std::shared_ptr<Communicator> g = r.comm->group(pair);
    EXPECT_EQ(g->backend(), "local+local");
    EXPECT_EQ(g->size(), 2);
    EXPECT_EQ(g->members(), pair);
    r.clear();
    const int64_t before = r.comm->routes().device.load();
    double x = 1;
    g->all_reduce(&x, &x, 1, DType::F64, Reduce::Sum);
    EXPECT_EQ(x, 2);
    ASSERT_EQ(r.host->size(), 1u);
    EXPECT_EQ(r.host->front().size, 2) << "the host side's group made the call";
    EXPECT_TRUE(r.device->empty());
    r.clear();
    DeviceMemory& memory = device_memory(kFake);
    const Stream stream = memory.create_stream();
    Tensor d = to_device(Tensor::from<float>(Shape{1}, {float(world.rank())}), kFake, stream);
    {
      DeviceBuffers scope(kFake, stream);
      g->all_reduce(d.device_ptr(), d.device_ptr(), 1, DType::F32, Reduce::Max);
    }
    EXPECT_EQ(floats(to_host(d, stream)), std::vector<float>{float(pair[1])});
    ASSERT_EQ(r.device->size(), 1u);
    EXPECT_EQ(r.device->front().size, 2) << "the device side's group made the call";
    EXPECT_TRUE(r.host->empty());
    EXPECT_EQ(r.comm->routes().device.load(), before + 1) << "a group's calls count in the world's routes";
    memory.destroy_stream(stream);
  });
}

TEST_F(Routing, SharedRegionsAndTheByteHelpersAreTheHostsAndCheckedByCallerReachesTheSide) {
  LocalWorld::run(2, [&](Communicator& world) {
    Routed r(world);
    DeviceMemory& memory = device_memory(kFake);
    const Stream stream = memory.create_stream();
    {
      DeviceBuffers scope(kFake, stream);
      const SharedRegions shared = r.comm->shared_regions(64);
      EXPECT_TRUE(shared) << "the threads backend's regions, through the host side";
      r.comm->shared_exchange(0);
    }
    EXPECT_TRUE(r.device->empty());
    ASSERT_EQ(r.host->size(), 2u);
    EXPECT_EQ(r.host->at(0).name, "shared_regions");
    EXPECT_EQ(r.host->at(1).name, "shared_exchange");
    r.clear();
    const std::string text = world.rank() == 0 ? "routed" : "";
    const std::vector<std::byte> got = r.comm->broadcast_bytes(std::as_bytes(std::span(text)), 0);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(got.data()), got.size()), "routed");
    EXPECT_FALSE(r.host->empty());
    EXPECT_TRUE(r.device->empty());
    r.clear();
    int64_t k = 1;
    r.comm->all_reduce(&k, &k, 1, DType::I64, Reduce::Sum);
    {
      CheckedByCaller checked(r.comm.get());
      r.comm->all_reduce(&k, &k, 1, DType::I64, Reduce::Sum);
    }
    ASSERT_EQ(r.host->size(), 2u);
    EXPECT_FALSE(r.host->at(0).checked);
    EXPECT_TRUE(r.host->at(1).checked) << "the scope on the routed communicator is opened on its side";
    EXPECT_EQ(k, 4);
    memory.destroy_stream(stream);
  });
}

// The Error of building a RoutedComm on every rank of `n` threads from sides `host` and `device`.
std::string refusal(int n, const std::function<std::vector<int>(int rank)>& host,
                    const std::function<std::vector<int>(int rank)>& device) {
  try {
    LocalWorld::run(n, [&](Communicator& world) {
      RoutedComm(world.group(host(world.rank())), world.group(device(world.rank())));
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(RoutedRefusal, SidesThatAreNotTheSameGroupAreRefusedNamingBoth) {
  const std::string sizes = refusal(2, [](int) { return std::vector<int>{0, 1}; }, [](int r) { return std::vector<int>{r}; });
  EXPECT_NE(sizes.find("routed communicator: the host side local (size 2, rank "), std::string::npos) << sizes;
  EXPECT_NE(sizes.find("the device side local (size 1, rank 0"), std::string::npos) << sizes;
  EXPECT_NE(sizes.find("not the same group of ranks"), std::string::npos) << sizes;
  const std::string order = refusal(2, [](int) { return std::vector<int>{0, 1}; }, [](int) { return std::vector<int>{1, 0}; });
  EXPECT_NE(order.find("members [0,1]"), std::string::npos) << order;
  EXPECT_NE(order.find("members [1,0]"), std::string::npos) << order;
}

}  // namespace
}  // namespace shardwise::comm
