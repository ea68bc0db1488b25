#include "dew/exit_status.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace dew {
namespace {

TEST(WaitStatus, DescribesExitsAndSignals) {
  EXPECT_EQ(describe_wait_status(3 << 8), "exit code 3");
  EXPECT_EQ(describe_wait_status(0), "exit code 0");
  EXPECT_EQ(describe_wait_status(SIGSEGV), "signal 11 (SIGSEGV)");
  EXPECT_EQ(describe_wait_status(SIGKILL | 0x80), "signal 9 (SIGKILL)") << "core dump bit";
}

TEST(WaitStatus, BadExitsAndPeerFailures) {
  EXPECT_FALSE(is_bad_exit(0));
  EXPECT_TRUE(is_bad_exit(3 << 8));
  EXPECT_TRUE(is_bad_exit(SIGTERM));
  EXPECT_TRUE(is_peer_failure(kPeerFailedExitCode << 8));
  EXPECT_FALSE(is_peer_failure(1 << 8));
  EXPECT_FALSE(is_peer_failure(SIGTERM));
}

TEST(WaitStatus, TheBlamedProcessNeverExitsZeroOrAsAPeer) {
  EXPECT_EQ(blamed_exit_code(3 << 8), 3);
  EXPECT_EQ(blamed_exit_code(SIGKILL), 137);
  EXPECT_EQ(blamed_exit_code(0), 1);  // it left while the others waited for it
  EXPECT_EQ(blamed_exit_code(kPeerFailedExitCode << 8), 1);
}

TEST(WaitStatus, ExitCodeAsAShellReportsIt) {
  EXPECT_EQ(exit_code_of(3 << 8), 3);
  EXPECT_EQ(exit_code_of(SIGKILL), 137);
  EXPECT_EQ(exit_code_of(0), 0);
}

}  // namespace
}  // namespace dew
