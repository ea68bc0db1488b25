// The sbatch templates in scripts/sbatch/, submitted with real sbatch.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "process.h"
#include "slurm_cluster.h"
#include "srun_output.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using namespace std::chrono_literals;

// Submits a template and waits for it; returns its output file's text.
std::string submit(const std::string& name, const std::vector<std::string>& args, bool expect_success = true,
                   const std::vector<std::string>& sbatch_options = {}) {
  const auto output = cluster().dir() + "/markers/" + name + ".out";
  std::filesystem::create_directories(cluster().dir() + "/markers");
  std::vector<std::string> argv{"sbatch", "--wait", "--output=" + output};
  argv.insert(argv.end(), sbatch_options.begin(), sbatch_options.end());
  argv.push_back(SlurmCluster::source_root() + "/scripts/sbatch/" + name);
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = cluster().command(argv, {}, 90s);
  EXPECT_EQ(r.exit_code == 0, expect_success) << describe(r) << "--- job output\n" << slurp(output);
  return slurp(output);
}

std::vector<std::string> identity_lines(const std::string& text) { return lines_starting_with(text, "dew rank "); }

TEST(SbatchTemplates, TwoNodeTemplatePrintsEveryTasksIdentity) {
  auto text = submit("two-node.sbatch", {});
  auto lines = identity_lines(text);
  ASSERT_EQ(lines.size(), 4u) << text;
  std::set<std::string> coordinators, nodes;
  // The coordinator: n1 by name where it resolves on the batch host (the namespaced cluster's nodes resolve
  // each other's names), else by its NodeAddr.
  const std::string identity("dew rank [0-3] of 4 on n[12] \\(node [01], local [01] of 2\\), coordinator (n1|" +
                             cluster().node_address("n1") + "):[0-9]+, GPUs .*");
  for (const auto& line : lines) {
    EXPECT_THAT(line, MatchesRegex(identity));
    coordinators.insert(line.substr(line.find("coordinator")));
    nodes.insert(line.substr(line.find(" on "), 6));
  }
  EXPECT_EQ(nodes.size(), 2u) << text;
  for (int rank = 0; rank < 4; ++rank) EXPECT_THAT(text, HasSubstr("dew rank " + std::to_string(rank) + " of 4"));
}

// The template's GPU line, given on sbatch's command line: each of a node's
// two tasks gets half of its 4 (stand-in) GPUs, not all of them.
TEST(SbatchTemplates, WithGpusEveryTaskOfTheTemplateGetsAnEvenShare) {
  auto text = submit("two-node.sbatch", {}, true, {"--gpus-per-node=4"});
  auto lines = identity_lines(text);
  ASSERT_EQ(lines.size(), 4u) << text;
  for (const auto& line : lines) {
    const bool first = line.find("local 0 of 2") != std::string::npos;
    EXPECT_THAT(line, ::testing::EndsWith(first ? "GPUs 0,1" : "GPUs 2,3")) << line;
  }
}

TEST(SbatchTemplates, OneNodeTemplateRunsTheGivenCommand) {
  auto text = submit("one-node.sbatch", {"bash", "-c", "echo \"task $DEW_PROCESS_ID of $DEW_PROCESS_COUNT\""});
  EXPECT_THAT(text, HasSubstr("task 0 of 2"));
  EXPECT_THAT(text, HasSubstr("task 1 of 2"));
}

TEST(SbatchTemplates, AFailingRankFailsTheJob) {
  auto text = submit("two-node.sbatch", {"bash", "-c", "[ \"$DEW_PROCESS_ID\" != 2 ] || exit 7; sleep 300"},
                     /*expect_success=*/false);
  // srun itself exits 137 (its killed tasks' status); the plugin's line is
  // what names the rank that failed and its code.
  EXPECT_THAT(text, HasSubstr("dew: rank 2 ended with exit code 7"));
}

}  // namespace
}  // namespace dew::testing
