// Broken topology files of each kind, and streams that never end: one line
// naming the file and the problem, never a crash or an endless read.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dew/topology.h"
#include "topology_fixtures.h"

namespace dew::topology {
namespace {

namespace fs = std::filesystem;
using testing::fixture;
using testing::fixture_files;
using ::testing::HasSubstr;
using testing::read;
using ::testing::StartsWith;

// --- Broken files: one line naming the file and the problem ---

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dew-topology-test-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  fs::path dir_;
};

using BrokenFiles = TempDir;

void expect_one_line_error(const Result<Topology>& result, const std::string& path) {
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message, StartsWith(path + ": "));
  EXPECT_EQ(result.error().message.find('\n'), std::string::npos) << result.error().message;
}

TEST_F(BrokenFiles, EveryXmlFixtureCutShortIsATruncationError) {
  for (const std::string& name : fixture_files()) {
    if (name.find(".xml") == std::string::npos) continue;
    SCOPED_TRACE(name);
    const std::string content = read(fixture(name));
    for (std::size_t keep : {content.size() / 2, content.size() - 20}) {
      const std::string path = write("cut-" + name, content.substr(0, keep));
      auto result = load_topology_file(path);
      expect_one_line_error(result, path);
      EXPECT_THAT(result.error().message, HasSubstr("truncated XML"));
    }
  }
}

TEST_F(BrokenFiles, MalformedXmlSaysWhere) {
  const std::string path = write("bad.xml", "<topology version=\"2.0\"><object type=\"Machine\"></topology>");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, AllOf(HasSubstr("malformed XML at byte"), HasSubstr("mismatch")));
}

TEST_F(BrokenFiles, WellFormedXmlThatHwlocRejects) {
  const std::string path = write("odd.xml", "<topology version=\"2.0\"><object type=\"Bogus\"/></topology>");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("hwloc rejected it"));
}

TEST_F(BrokenFiles, AFileThatWouldCrashHwlocIsRefusedBeforeHwlocReadsIt) {
  // hwloc 2.9 dereferences the complete_cpuset of a Package that has a
  // cpuset but no complete_cpuset (found by topology_loaders_fuzz). Dew
  // once read every file in a forked child first; now the sets hwloc relies
  // on are checked with pugixml, and hwloc reads the file in this process.
  std::string content = read(fixture("16amd64-4distances.xml"));
  for (const auto& [attribute, renamed, problem] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"complete_cpuset=", "completX_cpuset=", "has a cpuset but no complete_cpuset"},
           {" cpuset=", " cpusetX=", "has a complete_cpuset but no cpuset"},
           {"complete_nodeset=", "completX_nodeset=", "has a nodeset but no complete_nodeset"}}) {
    std::string broken = content;
    ASSERT_NE(broken.find(attribute), std::string::npos) << attribute;
    broken.replace(broken.find(attribute), attribute.size(), renamed);
    const std::string path = write("crashes-hwloc.xml", broken);
    auto result = load_topology_file(path);
    expect_one_line_error(result, path);
    EXPECT_THAT(result.error().message, AllOf(HasSubstr(problem), HasSubstr("allowed: cpuset with complete_cpuset")));
  }
}

TEST_F(BrokenFiles, APuWithoutOsIndexIsRefusedBeforeHwlocSpendsSecondsOnIt) {
  std::string content = read(fixture("16amd64-8n2c-cpusets.xml"));
  const std::size_t pu = content.find("type=\"PU\" os_index=");
  ASSERT_NE(pu, std::string::npos);
  content.replace(pu, std::string("type=\"PU\" os_index=").size(), "type=\"PU\" no_index=");
  const std::string path = write("pu.xml", content);
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message,
              HasSubstr("<object type=\"PU\" os_index=\"\"> is not allowed; allowed: an os_index from 0 to 1048575"));
}

TEST_F(BrokenFiles, MoreGpusThanATopologyHolds) {
  std::string header;
  for (int g = 0; g <= 1024; ++g) header += "\tGPU" + std::to_string(g);
  const std::string path = write("wide.txt", header + "\nGPU0\t X \n");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("the header names 1025 GPUs; allowed: at most 1024"));
}

TEST_F(BrokenFiles, XmlOfAnotherKind) {
  const std::string path = write("page.xml", "<?xml version=\"1.0\"?><html><body/></html>");
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("XML root element <html> is neither hwloc's <topology> nor NCCL's"));
}

TEST_F(BrokenFiles, EmptyBinaryMissingAndDirectory) {
  const std::string empty = write("empty.xml", " \n\t\n");
  expect_one_line_error(load_topology_file(empty), empty);
  EXPECT_THAT(load_topology_file(empty).error().message, HasSubstr("empty file"));

  const std::string binary = write("blob.bin", std::string("\x7f"
                                                           "ELF\0\0\x01\x02",
                                                           8));
  expect_one_line_error(load_topology_file(binary), binary);
  EXPECT_THAT(load_topology_file(binary).error().message, HasSubstr("not a topology file"));

  const std::string missing = (dir_ / "missing.xml").string();
  EXPECT_EQ(load_topology_file(missing).error().message, missing + ": cannot read: No such file or directory");

  EXPECT_EQ(load_topology_file(dir_.string()).error().message, dir_.string() + ": cannot read: it is a directory");
}

// A device or a FIFO has no size to check first: the limit holds for what
// is read, so an endless stream is refused after 64 MiB, not read forever.
TEST_F(BrokenFiles, EndlessStreamsStopAtTheSizeLimit) {
  const auto zero = load_topology_file("/dev/zero");
  expect_one_line_error(zero, "/dev/zero");
  EXPECT_EQ(zero.error().code, dew::ErrorCode::kInvalidArgument);
  EXPECT_THAT(zero.error().message, HasSubstr("/dev/zero: more than 64 MiB read, which is too large for a topology "
                                              "file; allowed: up to 64 MiB"));

  const std::string fifo = (dir_ / "endless.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::signal(SIGPIPE, SIG_IGN);
  std::thread writer([&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    const std::string block(1 << 16, '<');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
    ::close(fd);
  });
  const auto endless = load_topology_file(fifo);
  writer.join();
  EXPECT_THAT(endless.error().message, HasSubstr("more than 64 MiB read"));
}

// Issue 26: a FIFO nobody writes blocked `dew mesh --topology` for ever.
// Now a silent source is given up on after 10 s; a writer that comes late
// (a process substitution still starting) is waited for.
TEST_F(BrokenFiles, AFifoNobodyWritesIsGivenUpOnAndALateWriterIsWaitedFor) {
  const std::string silent = (dir_ / "silent.fifo").string();
  ASSERT_EQ(::mkfifo(silent.c_str(), 0600), 0);
  const auto started = std::chrono::steady_clock::now();
  const auto nobody = load_topology_file(silent);
  const auto waited = std::chrono::steady_clock::now() - started;
  expect_one_line_error(nobody, silent);
  EXPECT_THAT(nobody.error().message, HasSubstr(silent + ": nothing to read within 10 s"));
  EXPECT_LT(waited, std::chrono::seconds(15));

  const std::string late = (dir_ / "late.fifo").string();
  ASSERT_EQ(::mkfifo(late.c_str(), 0600), 0);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const int fd = ::open(late.c_str(), O_WRONLY);
    const std::string text = "<system><cpu numaid=\"x\"/></system>";
    [[maybe_unused]] auto wrote = ::write(fd, text.data(), text.size());
    ::close(fd);
  });
  const auto read_late = load_topology_file(late);
  writer.join();
  EXPECT_THAT(read_late.error().message, HasSubstr("<cpu numaid=\"x\"> is not allowed")) << "read, then parsed";
}

TEST_F(BrokenFiles, NcclXmlProblemsNameTheElement) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"<system><cpu numaid=\"0\"><gpu dev=\"0\"/></cpu></system>", "<gpu dev=\"0\"> outside a <pci> element"},
      {"<system><cpu numaid=\"0\"><pci busid=\"zz\" class=\"0x030200\"><gpu dev=\"0\"/></pci></cpu></system>",
       "<pci busid=\"zz\"> is not a PCI address"},
      {"<system><cpu numaid=\"x\"/></system>", "<cpu numaid=\"x\"> is not allowed"},
      {"<system><cpu numaid=\"0\" affinity=\"ffff,zz\"/></system>", "cpu mask 'ffff,zz' is not allowed"},
      {"<system><cpu numaid=\"0\"><pci busid=\"0000:07:00.0\" class=\"0x030200\"><gpu dev=\"0\"/></pci>"
       "<pci busid=\"0000:07:00.0\" class=\"0x030200\"><gpu dev=\"1\"/></pci></cpu></system>",
       "two <pci> elements have busid 0000:07:00.0"},
  };
  for (const auto& [content, problem] : cases) {
    SCOPED_TRACE(content);
    const std::string path = write("nccl.xml", content);
    auto result = load_topology_file(path);
    expect_one_line_error(result, path);
    EXPECT_THAT(result.error().message, HasSubstr(problem));
  }
}

// hwloc 3's format: the hwloc here (2.x) cannot read it, and says so by
// version, not by a missing element.
TEST_F(BrokenFiles, HwlocXmlOfANewerHwlocNamesBothVersions) {
  const std::string path = testing::fixture_dir() + "/../refused/hwloc3-box.xml";
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_EQ(result.error().code, ErrorCode::kUnsupported);
  EXPECT_THAT(result.error().message, HasSubstr("hwloc XML version 3.0 is hwloc 3's format; Dew reads hwloc XML "
                                                "with the hwloc here, 2."));
  EXPECT_THAT(result.error().message, HasSubstr("which reads versions 1 to 2"));
}

TEST_F(BrokenFiles, NcclXmlNestedTooDeepIsRefusedNotRecursedInto) {
  std::string deep = "<system>";
  for (int i = 0; i < 200; ++i)
    deep +=
        "<pci busid=\"0000:" + std::to_string(10 + i % 80) + ":00." + std::to_string(i / 80) + "\" class=\"0x060400\">";
  for (int i = 0; i < 200; ++i) deep += "</pci>";
  deep += "</system>";
  const std::string path = write("deep.xml", deep);
  auto result = load_topology_file(path);
  expect_one_line_error(result, path);
  EXPECT_THAT(result.error().message, HasSubstr("nested more than 64 deep"));
}

TEST_F(BrokenFiles, NvidiaSmiTextProblemsNameTheLineAndCell) {
  const std::string header = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {header + "GPU0\t X \tNV4\t0-7\t0\n", "the matrix has no row for GPU1 (truncated?)"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\n", "line 3: row GPU1 has 1 cells; the header names 2 devices"},
      {header + "GPU0\t X \tNVX\t0-7\t0\nGPU1\tNV4\t X \t0-7\t0\n",
       "line 2: GPU0/GPU1 cell 'NVX' is not one of X, NV#, PIX, PXB, PHB, NODE, SYS"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU1\tPHB\t X \t0-7\t0\n", "GPU1/GPU0 says 'PHB' but GPU0/GPU1 says 'NV4'"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\tSYS\t0-7\t0\n", "GPU1/GPU1 cell 'SYS' must be X"},
      {"GPU0\t X \tNV4\nGPU1\tNV4\t X \n", "line 1: the matrix has no header line above it"},
      {header + "GPU0\t X \tNV4\t0-7\t0\nGPU7\tNV4\t X \t0-7\t0\n", "line 3: row 'GPU7' is not a device"},
      {"\tGPU0\tGPU2\nGPU0\t X \tNV4\n", "line 1: the header names GPU2 where GPU1 belongs"},
  };
  for (const auto& [content, problem] : cases) {
    SCOPED_TRACE(content);
    const std::string path = write("topo.txt", content);
    auto result = load_topology_file(path);
    expect_one_line_error(result, path);
    EXPECT_THAT(result.error().message, HasSubstr(problem));
  }
}

TEST(ParseTopologyText, TheNameStandsForTheFile) {
  auto result = parse_topology_text("<topology", "pasted");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.error().message, StartsWith("pasted: truncated XML: it ends before </topology> ("));
}

}  // namespace
}  // namespace dew::topology
