// What a reference implementation outside shardwise (tools/pymodel_golden.py: the same model in
// PyTorch) needs to train exactly what a run trains: a parameter's initial value as the run draws
// it, and the batches of the run's first steps as its loader reads them; and the random stream of a
// dropout site, as the built-in models key theirs.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "errors.h"
#include "layouts.h"
#include "shardwise/cli/train/train_run.h"
#include "shardwise/core/philox.h"
#include "shardwise/models/custom.h"
#include "shardwise/train/trainer.h"

namespace shardwise::py {

void bind_reference(nb::module_& m) {
  m.def("_initial_value", [](const std::string& name, nb::handle shape, double std, double value, uint64_t seed) {
    return raising(ErrorKind::Usage, [&] {
      const Shape s = shape_of(shape, name);
      std::vector<int64_t> zeros(static_cast<size_t>(s.ndim()), 0);
      if (std > 0) return array_from(train::normal_param_block(name, s, zeros, s, seed, std));
      return array_from(Tensor::full(DType::F32, s, value));
    });
  }, nb::arg("name"), nb::arg("shape"), nb::arg("std"), nb::arg("value"), nb::arg("seed"),
     "A parameter's initial value as a run with `seed` draws it (nn.Parameter's std or value).");
  m.def("_stream_id", [](const std::string& site) { return stream_id(site); }, nb::arg("site"),
        "The random stream of a named site (dropout's masks are keyed by (seed, stream, sample, position)).");
  m.def("_batches", [](const std::vector<std::string>& args, int64_t steps) {
    nb::list out;
    const cli::ParsedTrain parsed = raising(ErrorKind::Usage, [&] { return cli::parse_train_args(args); });
    const train::TrainConfig& c = parsed.options.config;
    std::unique_ptr<train::Dataset> data = train::open_training_data(c);
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t B = c.optimizer.global_batch;
      train::Batch b = train::make_batch(*data, s * B, B, c.model.seq);
      out.append(nb::make_tuple(array_from(b.ids), array_from(b.labels)));
    }
    return out;
  }, nb::arg("args"), nb::arg("steps"),
     "(ids, labels) of each of the first `steps` global batches of `shardwise train ARGS` (--seq and "
     "--global-batch given).");
}

}  // namespace shardwise::py
