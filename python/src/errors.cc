#include "errors.h"

namespace shardwise::py {
namespace {

PyObject* g_error = nullptr;
PyObject* g_usage = nullptr;
PyObject* g_checkpoint = nullptr;
PyObject* g_data = nullptr;

PyObject* type_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Usage: return g_usage;
    case ErrorKind::Checkpoint: return g_checkpoint;
    case ErrorKind::Data: return g_data;
    case ErrorKind::General: break;
  }
  return g_error;
}

}  // namespace

void bind_errors(nb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("shardwise.Error",
                                      "An error shardwise raised: the message says what was wrong, the value, and "
                                      "what is allowed.",
                                      PyExc_RuntimeError, nullptr);
  g_usage = PyErr_NewExceptionWithDoc("shardwise.UsageError",
                                      "A bad argument or option: a name, placement, shape or value shardwise refuses.",
                                      g_error, nullptr);
  g_checkpoint = PyErr_NewExceptionWithDoc(
      "shardwise.CheckpointError",
      "A checkpoint could not be saved or loaded; nothing already saved was changed.", g_error, nullptr);
  g_data = PyErr_NewExceptionWithDoc("shardwise.DataError", "Training data or a tokenizer could not be used.",
                                     g_error, nullptr);
  m.attr("Error") = nb::handle(g_error);
  m.attr("UsageError") = nb::handle(g_usage);
  m.attr("CheckpointError") = nb::handle(g_checkpoint);
  m.attr("DataError") = nb::handle(g_data);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const KindedError& e) {
      PyErr_SetString(type_of(e.kind()), e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

}  // namespace shardwise::py
