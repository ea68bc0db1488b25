// An admin's typo on the plugin's plugstack.conf line, on a two-node cluster
// of its own started with it (scripts/slurm-testbed --plugin-args
// watchdog=forever): steps that never ask for Dew run as usual; those that
// do are refused, in one line naming the argument and what is allowed; the
// nodes' slurmd logs say so once per step, never once per task.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "process.h"
#include "slurm_cluster.h"
#include "srun_output.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

constexpr const char* kTypo = "watchdog=forever";
// parse_plugstack_args's own sentence for it, in every line about it.
constexpr const char* kTypoError =
    "plugstack.conf watchdog: 'forever' is not allowed; allowed: a duration such as 90s, 30m, 2h or 1h30m (at most "
    "8760h), or off";
const std::vector<std::string> kNodes = {"n1", "n2"};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// The lines of `text` that name the typo's key and value.
std::vector<std::string> lines_naming_the_typo(const std::string& text) {
  std::vector<std::string> named;
  for (const auto& line : lines_of(text)) {
    if (line.find("watchdog") != std::string::npos && line.find("'forever'") != std::string::npos) {
      named.push_back(line);
    }
  }
  return named;
}

// One line the plugin wrote to a node's slurmd log from a step's slurmstepd.
struct StepLogLine {
  std::string node;
  std::string step;  // "5.0", "6.batch"
  bool error = false;
  std::string text;
};

class BadPlugstackArgument : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/dew-badplug-XXXXXX";
    if (mkdtemp(pattern) == nullptr) return;
    dir_ = pattern;
    // On 127.0.0.1 (no --netns): no pool ever forms here, so no port of its
    // steps can meet another cluster's.
    std::vector<std::string> argv{SlurmCluster::source_root() + "/scripts/slurm-testbed",
                                  "start",
                                  dir_,
                                  "--plugin",
                                  cluster().plugin(),
                                  "--plugin-args",
                                  kTypo};
    if (!cluster().slurm_root().empty()) argv.insert(argv.end(), {"--slurm-root", cluster().slurm_root()});
    // (Its start runs `srun -N2 -n2 true`, which must pass with the typo.)
    const auto started = run(argv, env(conf()), 90s);
    if (started.exit_code != 0) start_error_ = describe(started);
    std::filesystem::create_directories(dir_ + "/markers");
    write_good_conf();
  }

  static void TearDownTestSuite() {
    if (dir_.empty()) return;
    // Whatever happened, start included: stop is a no-op on what is not running.
    const auto stopped = run({SlurmCluster::source_root() + "/scripts/slurm-testbed", "stop", dir_}, env(conf()), 60s);
    EXPECT_EQ(stopped.exit_code, 0) << describe(stopped);
    std::error_code ignored;
    if (!::testing::UnitTest::GetInstance()->Failed()) {
      std::filesystem::remove_all(dir_, ignored);
    } else {
      std::cerr << "bad-plugstack cluster's logs kept in " << dir_ << "/log\n";
    }
    dir_.clear();
  }

  void SetUp() override {
    ASSERT_FALSE(dir_.empty()) << "mkdtemp failed";
    ASSERT_TRUE(start_error_.empty()) << "scripts/slurm-testbed start --plugin-args " << kTypo << " failed:\n"
                                      << start_error_;
    for (const auto& node : kNodes) log_marks_[node] = std::filesystem::file_size(log_of(node));
  }

  static std::string conf() { return dir_ + "/slurm.conf"; }
  static std::string log_of(const std::string& node) { return dir_ + "/log/slurmd-" + node + ".log"; }
  static std::map<std::string, std::string> env(const std::string& slurm_conf) {
    return cluster().client_env({{"SLURM_CONF", slurm_conf}});
  }
  // ARGV against this cluster; `slurm_conf`: another copy of its slurm.conf.
  static RunResult command(const std::vector<std::string>& argv, const std::string& slurm_conf = conf()) {
    return run(argv, env(slurm_conf), 90s);
  }

  // A copy of slurm.conf whose plugstack.conf has no typo: what srun alone
  // reads when given it (the nodes keep the bad one). Written after the
  // start, which picks the cluster's ports.
  static void write_good_conf() {
    const std::string folder = dir_ + "/good";
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/plugstack.conf") << "required " << cluster().plugin() << "\n";
    const std::regex plugstack_line("^PlugStackConfig=.*$", std::regex::multiline);
    std::ofstream(folder + "/slurm.conf")
        << std::regex_replace(slurp(conf()), plugstack_line, "PlugStackConfig=" + folder + "/plugstack.conf");
    good_conf_ = folder + "/slurm.conf";
  }

  // What the plugin wrote to the nodes' slurmd logs since this test began.
  std::vector<StepLogLine> dew_log_lines() const {
    // "[2026-12-05T10:10:22.224] [1.0] error: dew: ..." (slurmstepd's lines carry the step)
    const std::regex line(R"(^\[[^\]]*\] \[([0-9]+\.[a-z0-9]+)\] (error: )?dew: (.*)$)");
    std::vector<StepLogLine> found;
    for (const auto& node : kNodes) {
      std::ifstream in(log_of(node));
      in.seekg(static_cast<std::streamoff>(log_marks_.at(node)));
      for (std::string text; std::getline(in, text);) {
        std::smatch match;
        if (std::regex_match(text, match, line)) found.push_back({node, match[1], match[2].matched, match[3]});
      }
    }
    return found;
  }

  // Each step that ran on a node logged one line there about the typo, an
  // error only where it asked for Dew; returns how many (node, step) logged.
  std::size_t expect_one_line_per_step_and_node(bool dew_step) const {
    std::map<std::pair<std::string, std::string>, int> per_step;
    for (const auto& logged : dew_log_lines()) {
      SCOPED_TRACE(logged.node + " [" + logged.step + "] " + logged.text);
      EXPECT_EQ(logged.error, dew_step);
      EXPECT_THAT(logged.text, HasSubstr(kTypoError));
      ++per_step[{logged.node, logged.step}];
    }
    for (const auto& [where, count] : per_step) {
      EXPECT_EQ(count, 1) << where.first << " [" << where.second << "]: once per step, not once per task";
    }
    return per_step.size();
  }

  static inline std::string dir_;
  static inline std::string start_error_;
  static inline std::string good_conf_;
  std::map<std::string, std::uintmax_t> log_marks_;
};

TEST_F(BadPlugstackArgument, AStepWithoutDewRunsAsUsualAndEachNodeNotesTheTypoOnce) {
  const auto r = command({"srun", "-N2", "-n2", "hostname"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(lines_of(r.out).size(), 2u) << describe(r);
  EXPECT_THAT(r.err, Not(HasSubstr("dew:"))) << describe(r);
  // One info line per node for the step, where the admin looks; no error.
  EXPECT_EQ(expect_one_line_per_step_and_node(false), 2u);
}

TEST_F(BadPlugstackArgument, SrunStillListsAndRecognisesTheDewOptions) {
  const auto help = command({"srun", "--help"});
  ASSERT_EQ(help.exit_code, 0) << describe(help);
  EXPECT_THAT(help.out, HasSubstr("--dew-pool"));
  EXPECT_THAT(help.out, HasSubstr("--dew-watchdog=DURATION|off"));
}

TEST_F(BadPlugstackArgument, ADewStepIsRefusedInSrunBeforeAnythingRunsInOneLine) {
  const auto marker = dir_ + "/markers/dew-pool";
  auto r = command({"srun", "--dew-pool", "-N2", "-n2", "touch", marker});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, Not(HasSubstr("unrecognized option")));
  auto named = lines_naming_the_typo(r.err);
  ASSERT_EQ(named.size(), 1u) << describe(r);
  EXPECT_EQ(named[0], std::string("srun: error: dew: ") + kTypoError +
                          "; this step asked for --dew-pool, which cannot run until the admin fixes plugstack.conf");
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the step ran";
  EXPECT_TRUE(dew_log_lines().empty()) << "no step reached the nodes";

  // Any --dew-* option asks for Dew.
  r = command({"srun", "--dew-watchdog=1h", "-N1", "-n1", "touch", marker});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  named = lines_naming_the_typo(r.err);
  ASSERT_EQ(named.size(), 1u) << describe(r);
  EXPECT_THAT(named[0], HasSubstr("this step asked for --dew-watchdog, which cannot run"));
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the step ran";
}

TEST_F(BadPlugstackArgument, ABatchScriptsPlainSrunRunsAndSbatchRefusesOnlyADewJob) {
  const auto output = dir_ + "/markers/batch.out";
  auto r = command({"sbatch", "--wait", "-N2", "--output=" + output, "--wrap", "srun -N2 -n2 hostname"});
  ASSERT_EQ(r.exit_code, 0) << describe(r) << "--- job output\n" << slurp(output);
  EXPECT_EQ(lines_of(slurp(output)).size(), 2u) << slurp(output);
  EXPECT_THAT(slurp(output), Not(HasSubstr("dew:")));
  EXPECT_THAT(r.err, Not(HasSubstr("dew:")));
  // The batch step on one node, the srun step on both: a note each, no error.
  EXPECT_EQ(expect_one_line_per_step_and_node(false), 3u);

  r = command({"sbatch", "--dew-pool", "--wrap", "true"});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  const auto named = lines_naming_the_typo(r.err);
  ASSERT_EQ(named.size(), 1u) << describe(r);
  EXPECT_THAT(named[0], HasSubstr(std::string("sbatch: error: dew: ") + kTypoError +
                                  "; this job asked for --dew-pool, which cannot run"));
}

// srun read a good plugstack.conf (another login node's), the nodes the bad
// one: each node refuses the step's tasks before exec and tells srun once;
// its slurmd log has the error once for the step, not once per task.
TEST_F(BadPlugstackArgument, NodesWithTheTypoRefuseADewStepThatSrunLetThrough) {
  const auto marker = dir_ + "/markers/node-refused";
  const auto r = command({"srun", "--dew-pool", "-N2", "-n4", "touch", marker}, good_conf_);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_FALSE(std::filesystem::exists(marker)) << "a task ran";
  const auto named = lines_naming_the_typo(r.err);
  EXPECT_EQ(named.size(), 2u) << "once per node, not once per task\n" << describe(r);
  for (const auto& line : named) {
    EXPECT_THAT(line, HasSubstr(kTypoError));
    EXPECT_THAT(line, HasSubstr("this step asked for --dew-pool, which cannot run until the admin fixes"));
  }
  EXPECT_EQ(expect_one_line_per_step_and_node(true), 2u);
}

}  // namespace
}  // namespace dew::testing
