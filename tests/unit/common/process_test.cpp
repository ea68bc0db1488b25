// The one spawner, with real programs: /bin/sh, a program that does not
// exist, a directory that does not exist.
#include "dew/process.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "dew/exit_status.h"

namespace dew {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

Captured run_sh(const std::string& script, SpawnOptions options = {}) {
  options.argv = {"/bin/sh", "-c", script};
  auto result = capture(options, 10s);
  EXPECT_TRUE(result.ok()) << (result.ok() ? "" : result.error().message);
  return result.ok() ? result.value() : Captured{};
}

TEST(Spawn, CapturesBothStreamsAndTheStatus) {
  const auto r = run_sh("echo out; echo err >&2; exit 3");
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(exit_code_of(r.wait_status), 3);
  EXPECT_FALSE(r.timed_out);
}

TEST(Spawn, SetsAndRemovesVariablesAndChangesDirectory) {
  setenv("DEW_SPAWN_TEST_GONE", "x", 1);
  SpawnOptions options;
  options.env = {{"DEW_SPAWN_TEST", "a b;$(c)"}, {"DEW_SPAWN_TEST_GONE", std::nullopt}};
  options.cwd = "/tmp";
  const auto r = run_sh("printf '%s|%s|%s' \"$DEW_SPAWN_TEST\" \"${DEW_SPAWN_TEST_GONE-unset}\" \"$PWD\"", options);
  unsetenv("DEW_SPAWN_TEST_GONE");
  EXPECT_EQ(r.out, "a b;$(c)|unset|/tmp");
}

TEST(Spawn, TheChildLeadsItsOwnProcessGroupWithDefaultSignals) {
  signal(SIGPIPE, SIG_IGN);  // ignored here; the child must get the default back
  const auto r = run_sh("ps -o pgid= -p $$; grep SigIgn /proc/$$/status");
  signal(SIGPIPE, SIG_DFL);
  std::istringstream lines(r.out);
  std::string pgid, ignored;
  lines >> pgid;
  std::getline(lines, ignored);
  std::getline(lines, ignored);
  EXPECT_NE(std::stoi(pgid), getpgrp());
  EXPECT_THAT(ignored, HasSubstr("0000000000000000")) << "no signal ignored in the child";
}

TEST(Spawn, AProgramThatDoesNotExistIsNotFound) {
  SpawnOptions missing;
  missing.argv = {"/nonexistent/dew-program"};
  auto child = spawn(missing);
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.error().code, ErrorCode::kNotFound);
  EXPECT_THAT(child.error().message, HasSubstr("/nonexistent/dew-program"));
  SpawnOptions elsewhere;
  elsewhere.argv = {"/bin/true"};
  elsewhere.cwd = "/nonexistent/dir";
  auto in_missing_dir = spawn(elsewhere);
  ASSERT_FALSE(in_missing_dir.ok());
  EXPECT_THAT(in_missing_dir.error().message, HasSubstr("/nonexistent/dir"));
  EXPECT_FALSE(spawn(SpawnOptions{}).ok()) << "an empty command";
}

TEST(Spawn, StdinPipeAndOutputFiles) {
  const std::string path = "/tmp/dew-spawn-test-" + std::to_string(getpid());
  SpawnOptions options;
  options.argv = {"/bin/sh", "-c", "read line; echo got $line; echo err >&2"};
  options.stdin_mode = Stdio::kPipe;
  options.stdout_mode = options.stderr_mode = Stdio::kFile;
  options.stdout_file = options.stderr_file = path;
  auto child = spawn(options);
  ASSERT_TRUE(child.ok()) << child.error().message;
  ASSERT_EQ(write(child.value().in, "secret\n", 7), 7);
  close(child.value().in);
  EXPECT_EQ(wait_for_exit(child.value().pid), 0);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  EXPECT_EQ(text.str(), "got secret\nerr\n");
}

TEST(Capture, ATimeoutKillsTheWholeGroup) {
  SpawnOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 30 & sleep 30; echo never"};
  auto r = capture(options, 300ms);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value().timed_out);
  EXPECT_LT(r.value().seconds, 5.0);
  EXPECT_EQ(r.value().out, "");
}

TEST(ThreadState, TheLetterAfterTheNameEvenWhenTheNameHoldsParenthesesAndSpaces) {
  EXPECT_EQ(state_in_stat_line("4242 (python3) R 1 4242 4242 0 -1"), 'R');
  EXPECT_EQ(state_in_stat_line("4243 (pt_gloo) S 1 4242"), 'S');
  EXPECT_EQ(state_in_stat_line("4244 (a) R (b) S 1 4242"), 'S');
  EXPECT_EQ(state_in_stat_line("4245 (tab\tname) D 1"), 'D');
  EXPECT_EQ(state_in_stat_line(""), std::nullopt);
  EXPECT_EQ(state_in_stat_line("4246 (no end R 1"), std::nullopt);
  EXPECT_EQ(state_in_stat_line("4247 (x)"), std::nullopt);
  EXPECT_EQ(state_in_stat_line("4248 (x)R 1"), std::nullopt);
  EXPECT_EQ(state_in_stat_line("4249 (x) 7 1"), std::nullopt);
}

TEST(ThreadState, ABusyThreadIsCountedAndASleepingOneIsNot) {
  std::atomic<bool> stop{false};
  // Blocked until the end: never runnable (a sleeper that woke every 10 ms
  // was caught runnable in all 50 looks on a loaded CI machine).
  std::mutex mutex;
  std::condition_variable stopped;
  std::thread sleeper([&] {
    std::unique_lock lock(mutex);
    stopped.wait(lock, [&] { return stop.load(); });
  });
  // The caller, busy itself, is left out; a sanitizer's own thread may be
  // caught working in one look, not in all.
  int fewest = 1000;
  for (int look = 0; look < 50; ++look) {
    fewest = std::min(fewest, runnable_threads_besides_caller());
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(fewest, 0);
  std::thread spinner([&] {
    while (!stop.load()) {
    }
  });
  int seen = 0;
  for (int look = 0; look < 200 && seen == 0; ++look) seen = runnable_threads_besides_caller();
  {
    std::lock_guard lock(mutex);
    stop = true;
  }
  stopped.notify_all();
  spinner.join();
  sleeper.join();
  EXPECT_EQ(seen, 1);
}

}  // namespace
}  // namespace dew
