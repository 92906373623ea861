#include "shardwise/cli/train/interrupt.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "shardwise/cli/train/run_header.h"

namespace shardwise::cli {

namespace {

std::atomic<int> g_signal{0}, g_agreed{0};
std::atomic<bool> g_say{true};
struct sigaction g_old_int {}, g_old_term {};

// Async-signal-safe: atomics, write(2) and _exit(2) only. The same signal again stops at once; the
// other one after the first does not (a Ctrl-C under mpirun brings SIGINT from the terminal and
// SIGTERM from mpirun together).
void on_signal(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig)) {
    if (none != sig) return;
    constexpr char kNow[] = "\nshardwise: second signal: stopping now, without a summary or a save\n";
    if (g_say.load()) (void)!::write(STDERR_FILENO, kNow, sizeof kNow - 1);
    ::_exit(kInterruptedExit);
  }
  constexpr char kAfter[] = "\nshardwise: stopping after this step (Ctrl-C again to stop at once)\n";
  if (g_say.load()) (void)!::write(STDERR_FILENO, kAfter, sizeof kAfter - 1);
}

}  // namespace

StopSignals::StopSignals(bool say) {
  clear_stop();
  g_say = say;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads and writes carry on; the loop looks at the request after each step
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  clear_stop();  // a later run in this process (the Python package's) starts without a stop request
}

int stop_signal() { return g_signal.load(); }

void request_stop(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
}

void clear_stop() {
  g_signal = 0;
  g_agreed = 0;
}

int agree_to_stop(comm::Communicator& world) {
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  int32_t mine = g_signal.load() != 0 ? g_signal.load() : kNone, first = kNone;
  world.all_reduce(&mine, &first, 1, DType::I32, comm::Reduce::Min);  // SIGINT (2) before SIGTERM (15)
  if (first == kNone) return 0;
  g_agreed = first;
  return first;
}

int agreed_stop() { return g_agreed.load(); }

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  return fmt::format("signal {}", sig);
}

std::string resume_command(const std::vector<std::string>& argv, const std::string& run_dir, int mpi_ranks) {
  std::string line;
  if (mpi_ranks > 0) {  // what this machine needs: root, and more processes than cores
    line = fmt::format("mpirun{}{} -np {} ", ::geteuid() == 0 ? " --allow-run-as-root" : "",
                       static_cast<unsigned>(mpi_ranks) > std::thread::hardware_concurrency() ? " --oversubscribe" : "",
                       mpi_ranks);
  }
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--resume" || a == "--run-dir") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--resume=", 0) == 0 || a.rfind("--run-dir=", 0) == 0) continue;
    line += shell_quoted(a) + " ";
  }
  return line + "--run-dir " + shell_quoted(run_dir) + " --resume auto";
}

}  // namespace shardwise::cli
