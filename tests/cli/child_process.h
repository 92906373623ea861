#pragma once
// A `shardwise` run as a child process the test can signal: its output read as it comes, so a test
// waits for an event (a line of output), never for a time.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace shardwise_cli_test {

class Child {
 public:
  // `sh -c LINE` with stdout and stderr into one pipe, in a process group of its own (as a shell
  // puts a job), so a test can signal the group the way Ctrl-C on a terminal does. LINE ends by
  // `exec`ing the program, so that the child's pid is the program's.
  explicit Child(const std::string& line) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);  // also here: no race with the child's own call
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (fd_ >= 0) ::close(fd_);
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Reads the output until it holds `needle` (true) or ends (false).
  bool wait_for(const std::string& needle) {
    while (out_.find(needle) == std::string::npos) {
      if (!read_some()) return false;
    }
    return true;
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  void signal_group(int sig) const { ::kill(-pid_, sig); }
  // Reads the rest of the output and waits for the child: its exit status, 128 + N when signal N killed it.
  int finish() {
    while (read_some()) {
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  }
  const std::string& out() const { return out_; }

 private:
  bool read_some() {
    char buf[4096];
    const ssize_t n = fd_ < 0 ? 0 : ::read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    out_.append(buf, static_cast<size_t>(n));
    return true;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string out_;
};

}  // namespace shardwise_cli_test
