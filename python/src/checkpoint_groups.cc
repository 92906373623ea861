#include <fmt/format.h>
#include <nanobind/stl/string.h>

#include <chrono>

#include "checkpoint.h"
#include "errors.h"
#include "shardwise/comm/byte_exchange.h"
#include "shardwise/comm/exchange_communicator.h"
#include "shardwise/comm/file_rendezvous.h"
#include "shardwise/comm/local.h"
#include "shardwise/comm/mpi.h"

namespace shardwise::py {
namespace {

std::string bytes_of(nb::handle item, std::string_view what) {
  SW_CHECK(nb::isinstance<nb::bytes>(item), "{} returned {} where bytes were expected", what,
           nb::cast<std::string>(nb::repr(nb::type_name(item.type()))));
  nb::bytes b = nb::borrow<nb::bytes>(item);
  return std::string(b.c_str(), b.size());
}

// A ByteExchange over a Python object with rank(), size() and all_gather_bytes(bytes) -> list of
// every rank's bytes in rank order, and optionally send_bytes(bytes, peer, tag) and
// recv_bytes(peer, tag) -> bytes. Every call takes the GIL (an async save calls it from its
// worker thread); a Python exception in a call becomes an Error with the exception's text.
class PyExchange final : public comm::ByteExchange {
 public:
  explicit PyExchange(nb::object group) : group_(std::move(group)) {
    describe_ = fmt::format("Python group {}", nb::cast<std::string>(nb::repr(group_)));
    calling("rank()/size()", [&] {
      rank_ = nb::cast<int>(group_.attr("rank")());
      size_ = nb::cast<int>(group_.attr("size")());
      return 0;
    });
    SW_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "{}: rank() {} and size() {} do not make a rank of a group",
             describe_, rank_, size_);
    messages_ = nb::hasattr(group_, "send_bytes") && nb::hasattr(group_, "recv_bytes");
  }
  ~PyExchange() override {
    nb::gil_scoped_acquire gil;
    group_.reset();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return describe_; }
  bool has_messages() const override { return messages_; }

  std::vector<std::string> all_gather_bytes(std::string_view mine) override {
    return calling("all_gather_bytes", [&] {
      nb::object got = group_.attr("all_gather_bytes")(nb::bytes(mine.data(), mine.size()));
      std::vector<std::string> out;
      for (nb::handle item : got) out.push_back(bytes_of(item, describe_ + ".all_gather_bytes"));
      SW_CHECK(out.size() == static_cast<size_t>(size_), "{}.all_gather_bytes returned {} items for a group of {}",
               describe_, out.size(), size_);
      return out;
    });
  }
  void send_bytes(std::string_view bytes, int peer, int tag) override {
    calling("send_bytes", [&] {  // its result dropped here, with the GIL held
      group_.attr("send_bytes")(nb::bytes(bytes.data(), bytes.size()), peer, tag);
      return 0;
    });
  }
  std::string recv_bytes(int peer, int tag) override {
    return calling("recv_bytes", [&] { return bytes_of(group_.attr("recv_bytes")(peer, tag), describe_ + ".recv_bytes"); });
  }

 private:
  nb::object group_;
  int rank_ = 0, size_ = 1;
  bool messages_ = false;
  std::string describe_;

  template <class F>
  auto calling(std::string_view method, F&& f) -> decltype(f()) {
    nb::gil_scoped_acquire gil;
    try {
      return f();
    } catch (nb::python_error& e) {
      fail("{}.{} raised {}", describe_, method, e.what());
    } catch (const nb::cast_error&) {
      fail("{}.{} returned a value of the wrong type (rank() and size(): int; all_gather_bytes: a list of bytes; "
           "recv_bytes: bytes)", describe_, method);
    }
  }
};

CheckpointGroup file_group(const std::string& dir, int rank, int size, double timeout_s) {
  SW_CHECK(size >= 1 && rank >= 0 && rank < size, "FileGroup: rank {} is not a rank of a group of {}", rank, size);
  SW_CHECK(timeout_s > 0, "FileGroup: timeout {} s is not positive", timeout_s);
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::shared_ptr<comm::ByteExchange> exchange;
  {
    nb::gil_scoped_release release;  // the other ranks may be threads of this process
    exchange = std::make_shared<comm::FileRendezvous>(dir, rank, size, timeout);
  }
  return {std::make_shared<comm::ExchangeCommunicator>(exchange), exchange->describe()};
}

CheckpointGroup object_group(nb::object group) {
  auto exchange = std::make_shared<PyExchange>(std::move(group));
  return {std::make_shared<comm::ExchangeCommunicator>(exchange), exchange->describe()};
}

}  // namespace

void bind_checkpoint_groups(nb::module_& m) {
  nb::class_<CheckpointGroup>(m, "CheckpointGroup",
                              "The ranks a checkpoint save runs over (shardwise.checkpoint makes them).")
      .def_prop_ro("rank", [](const CheckpointGroup& g) { return g.comm->rank(); })
      .def_prop_ro("size", [](const CheckpointGroup& g) { return g.comm->size(); })
      .def_prop_ro("backend", [](const CheckpointGroup& g) { return std::string(g.comm->backend()); })
      .def("__repr__", [](const CheckpointGroup& g) {
        return fmt::format("CheckpointGroup({}, rank {} of {})", g.what, g.comm->rank(), g.comm->size());
      });
  m.def("_file_group", [](const std::string& dir, int rank, int size, double timeout_s) {
    return raising(ErrorKind::Checkpoint, [&] { return file_group(dir, rank, size, timeout_s); });
  }, nb::arg("dir"), nb::arg("rank"), nb::arg("size"), nb::arg("timeout_s"),
        "A group over a file rendezvous in `dir` (comm/file_rendezvous.h); every rank joins it.");
  m.def("_object_group", [](nb::object group) {
    return raising(ErrorKind::Checkpoint, [&] { return object_group(std::move(group)); });
  }, nb::arg("group"), "A group over a Python object with rank(), size() and all_gather_bytes(bytes).");
  m.def("_mpi_group", [] {
    return raising(ErrorKind::Checkpoint, [&] { return CheckpointGroup{comm::mpi_world(), "MPI world"}; });
  }, "The MPI world (a process started without mpirun is a world of one).");
  m.def("_launched_by_mpirun", &comm::launched_by_mpirun, "Whether mpirun/mpiexec started this process.");
  m.def("_single_group", [] {
    return CheckpointGroup{comm::LocalWorld::create(1)->communicator(0), "one process"};
  }, "A group of one rank (this process).");
}

}  // namespace shardwise::py
