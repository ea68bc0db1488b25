// Failure records (dew/failure_record.h): what a launcher decides blame
// from, found only by the launch's own tag.
#include "dew/failure_record.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using dew::decode_failure_record;
using dew::encode_failure_record;
using dew::FailureRecord;

const std::string kTag = "0123456789abcdef";

FailureRecord record_of(int rank, const std::string& why) { return FailureRecord{rank, why, std::nullopt, "", 0}; }

TEST(FailureRecord, ReadsBackWhereverALabelPutItInTheLine) {
  const FailureRecord record{13, "process 13 stopped answering: no heartbeat for 10 s; it's \"odd\"\n", 139,
                             "gpu-node 7", 1796600000123456};
  const std::string line = encode_failure_record(kTag, record);
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line, whatever the reason holds";
  EXPECT_EQ(decode_failure_record(kTag, line), record);
  EXPECT_EQ(decode_failure_record(kTag, "[2] " + line + "\n"), record);
  EXPECT_EQ(decode_failure_record(kTag, "3: " + line), record);            // srun --label
  EXPECT_EQ(decode_failure_record(kTag, "srun: error: " + line), record);  // the plugin, through srun
}

TEST(FailureRecord, APeersWordWithoutExitCodeNodeOrReasonReadsBackAsSuch) {
  // A peer cannot know the failed process's exit code or node.
  const FailureRecord peer = record_of(2, "");
  const auto read = decode_failure_record(kTag, encode_failure_record(kTag, peer));
  ASSERT_TRUE(read);
  EXPECT_EQ(*read, peer);
  EXPECT_FALSE(read->exit_code);
  EXPECT_EQ(read->node, "");
}

TEST(FailureRecord, WordsAnotherTagNoTagOrAMalformedRecordAreNone) {
  const std::string line = encode_failure_record(kTag, record_of(1, "x"));
  for (const std::string& other :
       {std::string("ending: process 1 failed: x"), std::string("srun: error: dew: rank 1 ended with exit code 3"),
        encode_failure_record("ffffffffffffffff", record_of(1, "x")), kTag + " dew-failure 2 x - - 0 78",
        kTag + " dew-failure 2 1 - - 0 7", kTag + " dew-failure 2 1 - - 0 zz",
        kTag + " dew-failure 2 99999999999 - - 0 78", kTag + " dew-failure 2 1 256 - 0 78",
        kTag + " dew-failure 2 1 -3 - 0 78", kTag + " dew-failure 2 1 - - 0", kTag + " dew-failure 2 1 - - 0 78 9",
        kTag + " dew-failure 1 1 78", std::string("")}) {
    EXPECT_FALSE(decode_failure_record(kTag, other)) << other;
  }
  EXPECT_TRUE(decode_failure_record(kTag, kTag + " dew-failure 2 1 3 6e31 0 78"));
  EXPECT_FALSE(decode_failure_record("", line)) << "an empty tag matches nothing";
}

}  // namespace
