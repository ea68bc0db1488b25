// Preemption and requeue: scripts/sbatch/requeue.sbatch (--requeue, dew
// worker --resume auto) stopped mid-run by `scontrol requeue` and then by a
// job of a higher partition tier that needs its nodes; each start resumes
// from the last complete checkpoint, and the losses equal an uninterrupted
// run's. The checkpoint directory is shared by the two nodes (one host here:
// one file system; each node's TmpFS, DIR/tmp/nN, stays its own).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "slurm_cluster.h"
#include "srun_output.h"
#include "test_paths.h"
#include "worker_helpers.h"

namespace dew::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

// 40 steps of about 0.1 s on 8 devices (a checkpoint every 5 under the
// template): a start stopped just after a checkpoint has seconds left.
const std::vector<std::string> kTraining = {
    "--steps", "40",   "--devices-per-process", "2",  "--width", "64", "--mlp", "128", "--length", "32",
    "--dtype", "fp64", "--cache-dir",           "off"};

// The step of the checkpoint's manifest, or 0 while there is none.
int manifest_step(const std::string& directory) {
  const std::string text = read_text(directory + "/manifest.json");
  if (text.empty()) return 0;
  try {
    return nlohmann::json::parse(text).at("step").get<int>();
  } catch (const std::exception&) {
    return 0;  // being replaced right now: read again
  }
}

// Waits until the directory holds a checkpoint past `after`; false after 60 s.
bool wait_for_checkpoint_after(const std::string& directory, int after) {
  for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until;) {
    if (manifest_step(directory) > after) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Waits until the file at `path` holds `text`; false after `limit`.
bool wait_for_text(const std::string& path, const std::string& text, std::chrono::seconds limit) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
    if (read_text(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// Waits until the job has left the queue (done, whatever its end); false
// after `limit`.
bool wait_until_gone(const std::string& job, std::chrono::seconds limit) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
    const auto r = cluster().command({"squeue", "-h", "-j", job, "-o", "%T"}, {}, 10s);
    if (r.exit_code == 0 && r.out.empty()) return true;
    std::this_thread::sleep_for(200ms);
  }
  return false;
}

// The losses a tests/python/torch_ddp.py run wrote (--out); none when it
// wrote no file.
std::vector<double> torch_losses(const std::string& path) {
  std::ifstream in(path);
  return in ? nlohmann::json::parse(in).at("losses").get<std::vector<double>>() : std::vector<double>{};
}

// N of every "<prefix>N" line of a torch_ddp.py job's output, in order
// ("SAVED before step ", "RESUMED at step ").
std::vector<int> steps_said(const std::string& text, const std::string& prefix) {
  const std::regex said(prefix + "([0-9]+)");
  std::vector<int> steps;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), said); it != std::sregex_iterator(); ++it) {
    steps.push_back(std::stoi((*it)[1]));
  }
  return steps;
}

// The job's course in a few lines (its starts, stops, saves and resumes),
// traced after a failure's message: CI shows a failure's last lines, and the
// job's whole output ends in a hundred lines of losses.
std::string job_course(const std::string& text) {
  static const std::regex course_line(R"((dew-requeue:|SAVED before|RESUMED at|DUE TO|stopping at this)[^\n]*)");
  std::string course = "the job's course:";
  for (auto it = std::sregex_iterator(text.begin(), text.end(), course_line); it != std::sregex_iterator(); ++it) {
    course += "\n  " + it->str();
  }
  return course;
}

// Every save, then each of the 4 ranks resuming from it, in order.
void expect_each_save_resumed_by_every_rank(const std::string& text, std::size_t saves_expected_at_least) {
  const auto saves = steps_said(text, "SAVED before step ");
  ASSERT_GE(saves.size(), saves_expected_at_least) << text;
  EXPECT_TRUE(std::is_sorted(saves.begin(), saves.end())) << text;
  std::vector<int> each_rank_resumed;
  for (const int save : saves) each_rank_resumed.insert(each_rank_resumed.end(), 4, save);
  EXPECT_EQ(steps_said(text, "RESUMED at step "), each_rank_resumed) << text;
}

// A tests/python/torch_ddp.py job under scripts/sbatch/python-requeue.sbatch:
// its folder (with a fresh checkpoint/), and the environment that finds
// Dew's module; `skip` says why it cannot run (the module or torch missing).
struct TorchJob {
  std::string dir, skip;
  std::map<std::string, std::string> env;
  std::string script = SlurmCluster::source_root() + "/tests/python/torch_ddp.py";

  // An uninterrupted run of `steps` steps, its losses in reference.json.
  auto reference(int steps) const {
    return cluster().srun({"--dew-pool", "-N2", "--ntasks-per-node=2", "/usr/bin/python3", script, "--dew", "--steps",
                           std::to_string(steps), "--out", dir + "/reference.json"},
                          env, 120s);
  }
  // The job of `steps` steps of 0.4 s, checkpointed, its output in job.out
  // and its losses in resumed.json; `options` go to sbatch.
  auto submit(std::vector<std::string> options, int steps, std::vector<std::string> script_options = {}) const {
    std::vector<std::string> argv = {"sbatch", "--parsable", "--output=" + dir + "/job.out"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.insert(argv.end(), {SlurmCluster::source_root() + "/scripts/sbatch/python-requeue.sbatch", "/usr/bin/python3",
                             script, "--dew", "--steps", std::to_string(steps), "--step-sleep", "0.4", "--checkpoint",
                             dir + "/checkpoint", "--out", dir + "/resumed.json"});
    argv.insert(argv.end(), script_options.begin(), script_options.end());
    return cluster().command(argv, env, 30s);
  }
};

TorchJob torch_job(const std::string& name) {
  TorchJob job;
  const char* module = std::getenv("DEW_PYTHON_MODULE_DIR");
  if (module == nullptr || *module == '\0') {
    job.skip = "the dew Python module is not built";
  } else if (run({"/usr/bin/python3", "-c", "import torch"}).exit_code != 0) {
    job.skip = "python3-torch is missing";
  } else {
    job.env = {{"PYTHONPATH", module}};
  }
  job.dir = cluster().dir() + "/" + name;
  std::filesystem::remove_all(job.dir);
  std::filesystem::create_directories(job.dir + "/checkpoint");
  return job;
}

// Stops (SIGSTOP) the `dew` processes of `job`: a start frozen past its
// checkpoint stays mid-run however long Slurm takes to preempt it (on a fast
// machine the 40 steps were otherwise all done first). Slurm's ending of a
// job sends SIGCONT before SIGTERM, as for any stopped task. Only this
// cluster's (SLURM_CONF): another shard's cluster may have a job of the same
// id. Returns how many.
int freeze_job(const std::string& job, const std::string& program) {
  int frozen = 0;
  for (const int pid :
       processes_with(program, {"SLURM_JOB_ID=" + job, "SLURM_CONF=" + cluster().dir() + "/slurm.conf"})) {
    frozen += ::kill(pid, SIGSTOP) == 0;
  }
  return frozen;
}

TEST(RequeueSlurm, AJobRequeuedAndThenPreemptedResumesEachTimeAndMatchesAnUninterruptedRun) {
  const std::string dir = cluster().dir() + "/requeue";
  std::filesystem::create_directories(dir);
  // The uninterrupted run: the same pool, command and options, no checkpoints.
  std::vector<std::string> reference = {"--dew-pool", "-N2", "--ntasks-per-node=2", dew_exe(), "worker"};
  reference.insert(reference.end(), kTraining.begin(), kTraining.end());
  reference.insert(reference.end(), {"--out", dir + "/reference.json"});
  const auto ran = cluster().srun(reference, {}, 120s);
  ASSERT_EQ(ran.exit_code, 0) << describe(ran);

  const std::string checkpoints = dir + "/checkpoints", output = dir + "/job.out";
  std::vector<std::string> submit = {"sbatch", "--parsable", "--output=" + output,
                                     SlurmCluster::source_root() + "/scripts/sbatch/requeue.sbatch", checkpoints};
  submit.insert(submit.end(), kTraining.begin(), kTraining.end());
  submit.insert(submit.end(), {"--checkpoint-every", "5", "--out", dir + "/resumed.json"});
  const auto submitted = cluster().command(submit, {{"DEW", dew_exe()}}, 30s);
  ASSERT_EQ(submitted.exit_code, 0) << describe(submitted);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));

  // 1. Requeued by hand just after its first checkpoint, frozen there first:
  //    a step takes 20 ms here, and on a loaded machine the first start had
  //    written another checkpoint before the requeue landed, which the wait
  //    below then took for the second start's.
  ASSERT_TRUE(wait_for_checkpoint_after(checkpoints, 0)) << read_text(output);
  EXPECT_EQ(freeze_job(job, dew_exe()), 4) << read_text(output);
  const int first = manifest_step(checkpoints);
  const auto requeued = cluster().command({"scontrol", "requeue", job}, {}, 30s);
  ASSERT_EQ(requeued.exit_code, 0) << describe(requeued);
  // 2. Preempted, once started again and past another checkpoint, by a job
  //    of the higher tier that needs both nodes whole.
  ASSERT_TRUE(wait_for_checkpoint_after(checkpoints, first)) << read_text(output);
  EXPECT_EQ(freeze_job(job, dew_exe()), 4) << read_text(output);
  const auto urgent = cluster().command({"sbatch", "--parsable", "-p", "urgent", "-N2", "--exclusive",
                                         "--output=" + dir + "/urgent.out", "--wrap", "echo the urgent job ran"},
                                        {}, 30s);
  ASSERT_EQ(urgent.exit_code, 0) << describe(urgent);
  ASSERT_TRUE(wait_until_gone(job, 120s)) << read_text(output);

  const std::string text = read_text(output);
  SCOPED_TRACE(job_course(text));
  EXPECT_THAT(text, HasSubstr("dew-requeue: start 1 of job " + job));
  EXPECT_THAT(text, HasSubstr("dew-requeue: start 3 of job " + job));
  EXPECT_THAT(text, HasSubstr("DUE TO JOB REQUEUE"));
  EXPECT_THAT(text, HasSubstr("DUE TO PREEMPTION"));
  EXPECT_THAT(text, HasSubstr("--resume auto: no checkpoint in " + checkpoints + " yet: starting at step 1"));
  // Each later start names the checkpoint it resumed from, never step 1.
  const std::regex resumed("resuming from the checkpoint of step ([0-9]+) in ");
  std::vector<int> steps;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), resumed); it != std::sregex_iterator(); ++it) {
    steps.push_back(std::stoi((*it)[1]));
  }
  ASSERT_EQ(steps.size(), 2u) << text;
  EXPECT_GE(steps[0], first);
  EXPECT_GT(steps[1], steps[0]);
  EXPECT_LT(steps[1], 40);
  EXPECT_THAT(read_text(dir + "/urgent.out"), HasSubstr("the urgent job ran"));

  const auto want = read_report(dir + "/reference.json");
  const auto got = read_report(dir + "/resumed.json");
  ASSERT_EQ(got.losses.size(), 40u) << text;
  EXPECT_EQ(got.json.value("resumed_from", 0), steps[1]);
  EXPECT_LE(loss_gap(got.losses, want.losses), 1e-6) << text;
}

// Your own torch script under scripts/sbatch/python-requeue.sbatch, with
// pool.stop_requested() after each step (tests/python/torch_ddp.py
// --checkpoint): `scontrol requeue` (SIGTERM to every task, as a
// preemption), then Slurm's time-limit warning to the batch script
// (--signal=B:USR1, sent here at once by `scancel --signal=USR1 --batch`:
// Slurm's own comes within a minute of its time), then a preemption by a job
// of the higher tier that needs both nodes whole. Each time every rank stops
// at one step, rank 0 saves, the job starts again and resumes; the losses
// equal an uninterrupted run's.
TEST(RequeueSlurm, APythonScriptStopsAtOneStepOnRequeueTheTimeLimitsWarningAndPreemptionAndResumesExactly) {
  const TorchJob torch = torch_job("python-requeue");
  if (!torch.skip.empty()) GTEST_SKIP() << torch.skip;
  const std::string& dir = torch.dir;
  const auto ran = torch.reference(30);
  ASSERT_EQ(ran.exit_code, 0) << describe(ran);

  const std::string output = dir + "/job.out";
  const auto submitted = torch.submit({}, 30);
  ASSERT_EQ(submitted.exit_code, 0) << describe(submitted);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  const auto wait_for = [&](const std::string& text) { return wait_for_text(output, text, 90s); };
  ASSERT_TRUE(wait_for("step 2: loss")) << read_text(output);
  ASSERT_EQ(cluster().command({"scontrol", "requeue", job}, {}, 30s).exit_code, 0);
  ASSERT_TRUE(wait_for("dew-requeue: start 2 of job")) << read_text(output);
  ASSERT_TRUE(wait_for("step 8: loss")) << read_text(output);
  ASSERT_EQ(cluster().command({"scancel", "--signal=USR1", "--batch", job}, {}, 30s).exit_code, 0);
  ASSERT_TRUE(wait_for("dew-requeue: start 3 of job")) << read_text(output);
  // Preempted once the third start has run a step past its checkpoint:
  // before a script's first stop_requested() a SIGTERM ends it as a stop
  // from outside (nothing saved; it resumes from the last checkpoint), and on
  // 24.11 under load the preemption came before that.
  std::smatch second_save;
  const std::string so_far = read_text(output);
  const std::regex saves_so_far(R"(SAVED before step ([0-9]+)[\s\S]*SAVED before step ([0-9]+))");
  ASSERT_TRUE(std::regex_search(so_far, second_save, saves_so_far)) << so_far;
  ASSERT_TRUE(wait_for("step " + std::to_string(std::stoi(second_save[2].str()) + 1) + ": loss")) << read_text(output);
  const auto urgent = cluster().command({"sbatch", "--parsable", "-p", "urgent", "-N2", "--exclusive",
                                         "--output=" + dir + "/urgent.out", "--wrap", "echo the urgent job ran"},
                                        {}, 30s);
  ASSERT_EQ(urgent.exit_code, 0) << describe(urgent);
  ASSERT_TRUE(wait_until_gone(job, 180s)) << read_text(output);

  const std::string text = read_text(output);
  SCOPED_TRACE(job_course(text));
  EXPECT_THAT(text, HasSubstr("DUE TO JOB REQUEUE"));
  EXPECT_THAT(text, HasSubstr("dew-requeue: the time limit is near: asking every task to stop"));
  EXPECT_THAT(text, HasSubstr("dew-requeue: every task saved and returned: requeueing job " + job));
  EXPECT_THAT(text, HasSubstr("DUE TO PREEMPTION"));
  EXPECT_THAT(text, HasSubstr("dew-requeue: start 4 of job " + job));
  EXPECT_THAT(read_text(dir + "/urgent.out"), HasSubstr("the urgent job ran"));
  // The three stops: every rank at the same stop_requested(), one save each.
  EXPECT_EQ(occurrences(text, "stopping at this stop_requested(), with every process"), 12) << text;
  const auto saves = steps_said(text, "SAVED before step ");
  ASSERT_EQ(saves.size(), 3u) << text;
  EXPECT_LT(saves[0], saves[1]);
  EXPECT_LT(saves[1], saves[2]);
  EXPECT_LT(saves[2], 30);
  expect_each_save_resumed_by_every_rank(text, 3);
  const auto want = torch_losses(dir + "/reference.json");
  const auto got = torch_losses(dir + "/resumed.json");
  ASSERT_EQ(got.size(), 30u) << text;
  EXPECT_LE(loss_gap(got, want), 1e-6) << text;
}

// The warning after the tasks' last stop_requested(), while they end:
// srun exits 0 as after a stop, but nothing stopped early, and the job is
// done. It used to be requeued, and its next start ran the steps since the
// last checkpoint again (seen once in CI under a real time limit).
TEST(RequeueSlurm, AWarningAfterTheLastStepEndsTheJobWithoutARequeue) {
  const TorchJob torch = torch_job("python-warned-late");
  if (!torch.skip.empty()) GTEST_SKIP() << torch.skip;
  const std::string output = torch.dir + "/job.out";
  const auto submitted = torch.submit({}, 4, {"--linger", "6"});
  ASSERT_EQ(submitted.exit_code, 0) << describe(submitted);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  ASSERT_TRUE(wait_for_text(output, "LINGERING", 90s)) << read_text(output);
  ASSERT_EQ(cluster().command({"scancel", "--signal=USR1", "--batch", job}, {}, 30s).exit_code, 0);
  const bool gone = wait_until_gone(job, 60s);
  if (!gone) cluster().command({"scancel", job}, {}, 30s);
  ASSERT_TRUE(gone) << read_text(output);

  const std::string text = read_text(output);
  SCOPED_TRACE(job_course(text));
  EXPECT_THAT(text, HasSubstr("dew-requeue: the time limit is near: asking every task to stop")) << text;
  EXPECT_THAT(text, HasSubstr("dew-requeue: the warning came after the tasks' last stop_requested(): the training "
                              "is done, not requeued"))
      << text;
  EXPECT_THAT(text, Not(HasSubstr("dew-requeue: start 2"))) << text;
  EXPECT_EQ(torch_losses(torch.dir + "/resumed.json").size(), 4u) << text;
  EXPECT_TRUE(std::filesystem::is_empty(torch.dir + "/checkpoint")) << text;
}

// The warning before the tasks could take it (a program that SIGUSR1 ends:
// a Python script before dew.prepare_process()): srun exits 138, and the
// batch script still requeues the job, whose next start resumes from the
// last checkpoint; it used to end the job for good.
TEST(RequeueSlurm, AWarningThatEndedTheTasksBeforeTheyCouldTakeItStillRequeuesTheJob) {
  const std::string output = cluster().dir() + "/warned-early.out";
  std::filesystem::remove(output);
  const auto submitted =
      cluster().command({"sbatch", "--parsable", "--output=" + output,
                         SlurmCluster::source_root() + "/scripts/sbatch/python-requeue.sbatch", "/bin/sleep", "300"},
                        {}, 30s);
  ASSERT_EQ(submitted.exit_code, 0) << describe(submitted);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  const auto wait_for = [&](const std::string& text) { return wait_for_text(output, text, 60s); };
  ASSERT_TRUE(wait_for("dew-requeue: start 1 of job")) << read_text(output);
  std::this_thread::sleep_for(1s);  // srun's tasks running
  ASSERT_EQ(cluster().command({"scancel", "--signal=USR1", "--batch", job}, {}, 30s).exit_code, 0);
  const bool started_again = wait_for("dew-requeue: start 2 of job");
  cluster().command({"scancel", job}, {}, 30s);
  wait_until_gone(job, 60s);
  EXPECT_TRUE(started_again) << read_text(output);
  EXPECT_THAT(read_text(output), HasSubstr("dew-requeue: the warning came before the tasks could take it (SIGUSR1 "
                                           "ended them): requeueing job " +
                                           job));
}

// The same job under a real time limit: one minute, with Slurm's own warning
// 40 s before it (sbatch --time=1 --signal=B:USR1@40 on top of the
// template's @90). slurmctld sends it when its periodic look finds the time
// due: 20-50 s into each start, so every start has 20 s to get going (under
// CI's load Python and torch took more than the 10 s @50 left, and each
// start made one step), and the first, 150 steps of 0.4 s, is always
// warned before it is done. The script passes the warning on, every rank
// stops at one step, rank 0 saves, the script requeues the job, and the next
// start resumes until the steps are done: two to four starts, about 150 s.
// Never ended by the time limit itself; the losses equal an uninterrupted
// run's.
TEST(RequeueSlurm, APythonScriptWarnedBySlurmBeforeItsTimeLimitStopsAtOneStepAndResumesUntilDone) {
  const TorchJob torch = torch_job("python-time-limit");
  if (!torch.skip.empty()) GTEST_SKIP() << torch.skip;
  const std::string& dir = torch.dir;
  const auto ran = torch.reference(150);
  ASSERT_EQ(ran.exit_code, 0) << describe(ran);
  const std::string output = dir + "/job.out";
  const auto submitted = torch.submit({"--time=1", "--signal=B:USR1@40"}, 150);
  ASSERT_EQ(submitted.exit_code, 0) << describe(submitted);
  const std::string job = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  ASSERT_TRUE(wait_until_gone(job, 420s)) << read_text(output);

  const std::string text = read_text(output);
  SCOPED_TRACE(job_course(text));
  EXPECT_GE(occurrences(text, "dew-requeue: the time limit is near: asking every task to stop"), 1) << text;
  EXPECT_GE(occurrences(text, "dew-requeue: every task saved and returned: requeueing job " + job), 1) << text;
  EXPECT_THAT(text, Not(HasSubstr("DUE TO TIME LIMIT"))) << text;
  expect_each_save_resumed_by_every_rank(text, 1);
  const auto got = torch_losses(dir + "/resumed.json");
  ASSERT_EQ(got.size(), 150u) << text;
  EXPECT_LE(loss_gap(got, torch_losses(dir + "/reference.json")), 1e-6) << text;
}

}  // namespace
}  // namespace dew::testing
