// `dew launch`'s supervisor (namespace dew::launch; a library of its own,
// linked into the dew command, not libdew): runs the started processes to their end,
// writes their output lines with their rank, and stops them all at the first
// failure or at Ctrl-C / SIGTERM / SIGHUP.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dew/failure_record.h"
#include "dew/launch_plan.h"
#include "dew/process.h"

namespace dew::launch {

// One started process and the state of its output.
struct Running {
  int rank = 0;  // -1: srun, whose lines carry their own labels
  std::string host;
  bool remote = false;
  Child io;
  bool alive = true;
  int status = 0;
  LineSplitter out_lines, err_lines;
};

class Supervisor {
 public:
  // `grace`: how long a stopped process has between SIGTERM and SIGKILL.
  // Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP for this process: the
  // supervisor reads them from a signalfd.
  // `notice_tag`: the launch's DEW_NOTICE_TAG; lines holding its failure
  // records (dew/failure_record.h) decide blame and are not printed.
  Supervisor(std::chrono::milliseconds grace, std::string notice_tag);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  void add(Running process);
  // Runs until every process has ended; returns the launcher's exit code:
  // the failing process's (its code, or 128 + signal), 128 + signal for a
  // signal the launcher received, else 0. Never kPeerFailedExitCode: when
  // every failure is a pool's "a peer failed", the process its peers named
  // in their failure records (a frozen one) is the failure; under srun, the
  // rank the plugin's or the peers' records named.
  int run();
  // Stops every process: SIGTERM (and SIGCONT, so that a stopped process
  // gets it), then SIGKILL after the grace (run() waits).
  void stop();

 private:
  bool any_alive() const;
  int open_streams() const;
  void emit(const Running& p, bool err, const std::string& line);
  void pump(Running& p, bool err);
  void handle_signals();
  std::vector<Running*> collect();
  void reap();
  void report(const Running& p);
  // To every running process's group but `sparing` (a rank), if given.
  void signal_all(int signo, std::optional<int> sparing = std::nullopt);
  void note_line(const Running& p, const std::string& line);
  void take_record(const FailureRecord& record);
  void report_blamed(const Running& peer);
  void say_awaited_end(const Running& p);
  int srun_exit_code() const;

  std::chrono::milliseconds grace_;
  std::string notice_tag_;
  int signal_fd_ = -1;
  bool stopping_ = false;
  int exit_code_ = 0;
  bool signalled_ = false;  // the launcher itself was told to stop
  std::vector<std::unique_ptr<Running>> processes_;
  std::optional<PeerBlame> blame_;  // the first process a failure record named
  std::optional<int> awaited_;      // that rank, still running when the failure was named
  // When the awaited rank is stopped too: it is given a moment to end on its
  // own (one that left the pool ends with its own code once its peers are gone).
  std::optional<std::chrono::steady_clock::time_point> awaited_stop_at_;
  // The peers' word of it, said only if it does not end by itself first
  // (then its own exit code is said): one line, named once.
  std::optional<std::string> awaited_line_;
  std::vector<SrunTaskEnd> srun_ends_;
};

// One whole line on a stream with a single write().
void write_all(int fd, const std::string& text);

// "passwordless ssh must work: check that `ssh -o BatchMode=yes HOST true` succeeds".
std::string ssh_hint(const std::string& host);

}  // namespace dew::launch
