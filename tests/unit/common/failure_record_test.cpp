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

TEST(FailureRecord, ReadsBackWhereverALabelPutItInTheLine) {
  const FailureRecord record{13, "process 13 stopped answering: no heartbeat for 10 s; it's \"odd\"\n"};
  const std::string line = encode_failure_record(kTag, record);
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line, whatever the reason holds";
  EXPECT_EQ(decode_failure_record(kTag, line), record);
  EXPECT_EQ(decode_failure_record(kTag, "[2] " + line + "\n"), record);
  EXPECT_EQ(decode_failure_record(kTag, "3: " + line), record);            // srun --label
  EXPECT_EQ(decode_failure_record(kTag, "srun: error: " + line), record);  // the plugin, through srun
}

TEST(FailureRecord, WordsAnotherTagNoTagOrAMalformedRecordAreNone) {
  const std::string line = encode_failure_record(kTag, FailureRecord{1, "x"});
  for (const std::string& other :
       {std::string("ending: process 1 failed: x"), std::string("srun: error: dew: rank 1 ended with exit code 3"),
        encode_failure_record("ffffffffffffffff", FailureRecord{1, "x"}), kTag + " dew-failure 1 x 78",
        kTag + " dew-failure 1 1 7", kTag + " dew-failure 1 1 zz", kTag + " dew-failure 1 99999999999 78",
        kTag + " dew-failure 2 1 78", std::string("")}) {
    EXPECT_FALSE(decode_failure_record(kTag, other)) << other;
  }
  EXPECT_FALSE(decode_failure_record("", line)) << "an empty tag matches nothing";
}

}  // namespace
