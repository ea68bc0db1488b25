// Starting programs: the one spawner behind `dew launch`, the launcher's
// queries (srun --help, ssh), the benchmarks and the tests' process helpers;
// and what this process's own threads are doing (/proc/self/task).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dew/result.h"

namespace dew {

// Where a child's standard stream goes.
enum class Stdio {
  kNull,     // /dev/null
  kPipe,     // a pipe whose other end the caller gets in Child
  kInherit,  // the caller's own
  kFile,     // a file, created or truncated (stdout_file / stderr_file)
};

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  // Set on top of the caller's environment, in order; nullopt removes.
  std::vector<std::pair<std::string, std::optional<std::string>>> env;
  std::string cwd;  // empty: the caller's
  Stdio stdin_mode = Stdio::kNull;
  Stdio stdout_mode = Stdio::kPipe;
  Stdio stderr_mode = Stdio::kPipe;
  std::string stdin_file;
  std::string stdout_file;
  std::string stderr_file;  // the same path as stdout_file: both into one file
  // SIGTERM reaches the child when the caller dies (Linux's parent-death signal).
  bool die_with_parent = false;
};

// A started child: in a process group of its own (pid == its group), with
// default signal handling and an empty signal mask. The pipes are the
// caller's ends, -1 where the stream is not a pipe; all are close-on-exec.
struct Child {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
  int err = -1;
};

// Returns once the child has called exec: then no descriptor of the
// caller's lives on in it. A program that cannot run is an Error naming it
// (kNotFound when it does not exist, else kSystem), as are failed pipes,
// forks and directories.
Result<Child> spawn(const SpawnOptions& options);

struct Captured {
  int wait_status = 0;
  bool timed_out = false;
  std::string out;
  std::string err;
  double seconds = 0;  // from start to exit
};

// Runs the program to its end (its stdout and stderr piped and read), or
// until `timeout`, when its whole group is SIGKILLed and timed_out is set.
Result<Captured> capture(SpawnOptions options, std::chrono::milliseconds timeout);

// waitpid that retries on EINTR; the raw wait status, or nullopt when the
// child is not (or no longer) ours.
std::optional<int> wait_for_exit(pid_t pid);

// The caller's environment as NAME=VALUE strings, with `changes` applied.
std::vector<std::string> environment_with(
    const std::vector<std::pair<std::string, std::optional<std::string>>>& changes);

// The state letter of a thread's /proc/<pid>/task/<tid>/stat line ('R'
// running or runnable, 'S' sleeping, ...): the field after the name, found
// after the name's last ')' (a thread may name itself "a) R (b"). nullopt
// for a line that is not one.
std::optional<char> state_in_stat_line(std::string_view line);

// How many of this process's threads, the caller left out, are running or
// runnable now ('R'); 0 when /proc cannot be read.
int runnable_threads_besides_caller();

}  // namespace dew
