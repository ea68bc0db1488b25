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
#include <sys/utsname.h>
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

#include "dew/exit_status.h"
#include "dew/median.h"
#include "dew/process.h"

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
  dew::SpawnOptions options;
  options.argv = argv;
  const long long start = now_ns();
  auto ran = dew::capture(options, std::chrono::minutes(2));
  const long long end = now_ns();
  if (!ran.ok()) {
    std::fprintf(stderr, "launch_latency: %s\n", ran.error().message.c_str());
    std::exit(1);
  }
  const dew::Captured& r = ran.value();
  const auto at = r.out.find("joined ");
  if (r.timed_out || r.wait_status != 0 || at == std::string::npos) {
    std::fprintf(stderr, "launch_latency: %s failed (%s), output:\n%s%s\n", quoted(argv).c_str(),
                 r.timed_out ? "no end within 2 minutes" : dew::describe_wait_status(r.wait_status).c_str(),
                 r.out.c_str(), r.err.c_str());
    std::exit(1);
  }
  const long long joined = std::atoll(r.out.c_str() + at + 7);
  return {static_cast<double>(joined - start) / 1e9, static_cast<double>(end - start) / 1e9};
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
      std::printf("  %-3d %-8s %5d  %7.3f  %7.3f  %7.3f  %7.3f\n", n, name, runs, dew::median(joined),
                  *std::min_element(joined.begin(), joined.end()), *std::max_element(joined.begin(), joined.end()),
                  dew::median(whole));
    };
    row("dew", dew_joined, dew_whole);
    row("mpirun", mpi_joined, mpi_whole);
    const double ratio = dew::median(dew_joined) / dew::median(mpi_joined);
    std::printf("  %-3d ratio of medians (dew / mpirun): %.3f (whole run: %.3f)\n", n, ratio,
                dew::median(dew_whole) / dew::median(mpi_whole));
    met = met && ratio <= 1.5;
    std::fflush(stdout);
  }
  std::printf("\ntarget: ratio <= 1.5 at every size: %s\n", met ? "met" : "not met");
  std::printf("load avg:  %s (at end)\n", first_line("/proc/loadavg").substr(0, 14).c_str());
  return 0;
}
