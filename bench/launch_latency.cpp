// launch_latency: how long `dew launch` takes from its start until every
// process of a local pool has joined, against Open MPI's mpirun starting an
// equivalent program, for 4, 8 and 16 processes.
//
//   build/bench/launch_latency [--runs N] [--sizes 4,8,16]
//
// dew:    dew launch --processes-per-host N -- bench/launch_rendezvous
//         (every process connects to process 0 at DEW_COORDINATOR_ADDRESS)
// mpirun: mpirun --allow-run-as-root --oversubscribe -np N bench/mpi_barrier
//         (MPI_Init + MPI_Barrier)
// In both, process 0 prints "joined <CLOCK_REALTIME ns>" once all have
// joined; the figure is that time minus the moment the launcher was started.
// The whole run (to the launcher's exit) is reported beside it. Both
// variants run in the same run, interleaved (A B, B A, ...), after one
// uncounted warm-up each. Target: dew's median <= 1.5 x mpirun's.
// Exit status: 0 when the measurement completes, met or not; 1 on errors.
#include <fcntl.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

struct Sample {
  double joined = 0;  // seconds from start to all joined
  double whole = 0;   // seconds from start to the launcher's exit
};

long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

std::string quoted(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + ("'" + a + "'");
  return out;
}

// Runs argv, returns the sample or exits on failure.
Sample run_once(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe(out) != 0) std::exit(1);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> args = argv;
  std::vector<char*> c_args;
  for (auto& a : args) c_args.push_back(a.data());
  c_args.push_back(nullptr);
  const long long start = now_ns();
  pid_t pid = 0;
  if (posix_spawnp(&pid, c_args[0], &actions, nullptr, c_args.data(), environ) != 0) {
    std::fprintf(stderr, "launch_latency: cannot start %s\n", argv[0].c_str());
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = read(out[0], buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(n));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const long long end = now_ns();
  const auto at = text.find("joined ");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || at == std::string::npos) {
    std::fprintf(stderr, "launch_latency: %s failed (status %d), output:\n%s\n", quoted(argv).c_str(), status,
                 text.c_str());
    std::exit(1);
  }
  const long long joined = std::atoll(text.c_str() + at + 7);
  return {static_cast<double>(joined - start) / 1e9, static_cast<double>(end - start) / 1e9};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string os_name() {
  std::ifstream in("/etc/os-release");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("PRETTY_NAME=", 0) == 0) {
      std::string name = line.substr(12);
      name.erase(std::remove(name.begin(), name.end(), '"'), name.end());
      return name;
    }
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  std::vector<int> sizes = {4, 8, 16};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (arg == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(std::atoi(item.c_str()));
    } else {
      std::fprintf(stderr, "usage: launch_latency [--runs N] [--sizes 4,8,16]\n");
      return 2;
    }
  }
  if (runs < 3 || sizes.empty() || std::any_of(sizes.begin(), sizes.end(), [](int n) { return n < 1; })) {
    std::fprintf(stderr, "launch_latency: --runs must be >= 3 and --sizes whole numbers >= 1\n");
    return 2;
  }

  char date[64];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  std::printf("launch-to-all-joined latency: dew launch against mpirun, local processes\n");
  std::printf("date:      %s\n", date);
  std::printf("machine:   %u cores, %s\n", std::thread::hardware_concurrency(), os_name().c_str());
  std::printf("load avg:  %s (at start)\n", first_line("/proc/loadavg").substr(0, 14).c_str());
  std::printf("dew:       %s --processes-per-host N -- %s\n", DEW_EXE, RENDEZVOUS_EXE);
  std::printf("mpirun:    mpirun --allow-run-as-root --oversubscribe -np N %s\n", MPI_BARRIER_EXE);
  std::printf(
      "timed:     from the launcher's start to process 0 seeing all N joined (whole: to the launcher's exit)\n");
  std::printf("runs:      %d of each per size, interleaved, after 1 uncounted warm-up of each\n\n", runs);
  std::printf("  N   variant   runs   median    min      max    whole median  (seconds)\n");

  bool met = true;
  for (const int n : sizes) {
    const std::vector<std::string> dew = {DEW_EXE,           "launch", "--processes-per-host",
                                          std::to_string(n), "--",     RENDEZVOUS_EXE};
    const std::vector<std::string> mpi = {"mpirun", "--allow-run-as-root", "--oversubscribe",
                                          "-np",    std::to_string(n),     MPI_BARRIER_EXE};
    run_once(dew);
    run_once(mpi);
    std::vector<double> dew_joined, dew_whole, mpi_joined, mpi_whole;
    for (int r = 0; r < runs; ++r) {
      for (int k = 0; k < 2; ++k) {
        const bool dew_turn = (r % 2 == 0) == (k == 0);
        const Sample s = run_once(dew_turn ? dew : mpi);
        (dew_turn ? dew_joined : mpi_joined).push_back(s.joined);
        (dew_turn ? dew_whole : mpi_whole).push_back(s.whole);
      }
    }
    auto row = [&](const char* name, const std::vector<double>& joined, const std::vector<double>& whole) {
      std::printf("  %-3d %-8s %5d  %7.3f  %7.3f  %7.3f  %7.3f\n", n, name, runs, median(joined),
                  *std::min_element(joined.begin(), joined.end()), *std::max_element(joined.begin(), joined.end()),
                  median(whole));
    };
    row("dew", dew_joined, dew_whole);
    row("mpirun", mpi_joined, mpi_whole);
    const double ratio = median(dew_joined) / median(mpi_joined);
    std::printf("  %-3d ratio of medians (dew / mpirun): %.3f (whole run: %.3f)\n", n, ratio,
                median(dew_whole) / median(mpi_whole));
    met = met && ratio <= 1.5;
    std::fflush(stdout);
  }
  std::printf("\ntarget: ratio <= 1.5 at every size: %s\n", met ? "met" : "not met");
  std::printf("load avg:  %s (at end)\n", first_line("/proc/loadavg").substr(0, 14).c_str());
  return 0;
}
