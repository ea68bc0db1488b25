// MeshSpec parsing and resolution: both spellings, and every refusal with
// its exact message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dew/mesh.h"

namespace dew::mesh {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kData = 0, kStage = 1, kFsdp = 2, kExpert = 3, kTensor = 4, kSequence = 5;

std::string error_of(std::string_view text) {
  auto spec = parse_mesh_spec(text);
  return spec.ok() ? "(parsed)" : spec.error().message;
}

TEST(MeshSpecTest, JsonSetsTheNamedAxesAndLeavesTheRestUnset) {
  auto spec = parse_mesh_spec(R"({"fsdp": 2, "replicas": 2})");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec.value().sizes[kFsdp], 2);
  EXPECT_EQ(spec.value().replicas, 2);
  for (const int axis : {kData, kStage, kExpert, kTensor, kSequence}) EXPECT_FALSE(spec.value().sizes[axis]);
}

TEST(MeshSpecTest, PairsReadTheSameAsJson) {
  auto pairs = parse_mesh_spec(" data=2 , stage=1,fsdp=2,expert=1,tensor=2, sequence=3,replicas=2 ");
  auto json = parse_mesh_spec(R"({"data":2,"stage":1,"fsdp":2,"expert":1,"tensor":2,"sequence":3,"replicas":2})");
  ASSERT_TRUE(pairs.ok()) << pairs.error().message;
  ASSERT_TRUE(json.ok()) << json.error().message;
  EXPECT_EQ(pairs.value().sizes, json.value().sizes);
  EXPECT_EQ(pairs.value().replicas, json.value().replicas);
  EXPECT_EQ(pairs.value().sizes[kSequence], 3);
  EXPECT_EQ(pairs.value().sizes[kData], 2);
}

TEST(MeshSpecTest, EmptyObjectIsDataParallelAndLeadingZerosAreDecimal) {
  auto empty = parse_mesh_spec(" {} ");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty.value().replicas, 1);
  auto shape = resolve_shape(empty.value(), 8);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape.value(), (MeshShape{8, 1, 1, 1, 1, 1}));
  auto padded = parse_mesh_spec("tensor=08");
  ASSERT_TRUE(padded.ok());
  EXPECT_EQ(padded.value().sizes[kTensor], 8);
}

TEST(MeshSpecTest, FormatReadsBackToTheSameSpec) {
  for (const char* text : {"{}", "fsdp=2,replicas=2", "data=4,sequence=2", R"({"tensor": 8, "data": 1})"}) {
    auto spec = parse_mesh_spec(text);
    ASSERT_TRUE(spec.ok()) << text;
    const std::string formatted = format_mesh_spec(spec.value());
    auto again = parse_mesh_spec(formatted);
    ASSERT_TRUE(again.ok()) << formatted;
    EXPECT_EQ(again.value().sizes, spec.value().sizes) << formatted;
    EXPECT_EQ(again.value().replicas, spec.value().replicas) << formatted;
  }
  EXPECT_EQ(format_mesh_spec(parse_mesh_spec(R"({"replicas":2,"fsdp":2})").value()), "fsdp=2,replicas=2");
}

TEST(MeshSpecTest, EmptyTextIsRefused) {
  const std::string message =
      "mesh spec is empty; allowed: a JSON object such as {\"fsdp\": 2} or axis=size pairs such as fsdp=2 ({} "
      "for data parallel over every device)";
  EXPECT_EQ(error_of(""), message);
  EXPECT_EQ(error_of("  \t\n"), message);
  EXPECT_EQ(parse_mesh_spec_json("").error().message, message);
}

TEST(MeshSpecTest, UnknownAxisIsNamed) {
  const std::string allowed = "; allowed: data, stage, fsdp, expert, tensor, sequence, replicas";
  EXPECT_EQ(error_of(R"({"fsdp": 2, "fdsp": 2})"), "mesh spec: unknown axis 'fdsp'" + allowed);
  EXPECT_EQ(error_of("tensor=2,Sequence=2"), "mesh spec: unknown axis 'Sequence'" + allowed);
  EXPECT_EQ(error_of("=2"), "mesh spec: unknown axis ''" + allowed);
  // A control byte in a name is escaped: the message stays one line.
  EXPECT_EQ(error_of("{\"a\\nb\": 1}"), "mesh spec: unknown axis 'a\\x0ab'" + allowed);
}

TEST(MeshSpecTest, RepeatedAxisIsNamed) {
  EXPECT_EQ(error_of(R"({"fsdp": 2, "fsdp": 4})"), "mesh spec: axis 'fsdp' is given twice; give it once");
  EXPECT_EQ(error_of("replicas=2,fsdp=2,replicas=2"), "mesh spec: axis 'replicas' is given twice; give it once");
}

TEST(MeshSpecTest, SizesOtherThanWholeNumbersFromOneAreRefused) {
  const std::string allowed = " is not allowed; allowed: a whole number from 1 to 1048576";
  EXPECT_EQ(error_of(R"({"fsdp": 0})"), "mesh spec: fsdp = '0'" + allowed);
  EXPECT_EQ(error_of(R"({"tensor": -2})"), "mesh spec: tensor = '-2'" + allowed);
  EXPECT_EQ(error_of(R"({"fsdp": 2.5})"), "mesh spec: fsdp = '2.5'" + allowed);
  EXPECT_EQ(error_of(R"({"fsdp": 2.0})"), "mesh spec: fsdp = '2.0'" + allowed);
  EXPECT_EQ(error_of(R"({"fsdp": 2e1})"), "mesh spec: fsdp = '2e1'" + allowed);
  EXPECT_EQ(error_of(R"({"fsdp": "2"})"), "mesh spec: fsdp = '\"2\"'" + allowed);
  EXPECT_EQ(error_of(R"({"fsdp": true})"), "mesh spec: fsdp = 'true'" + allowed);
  EXPECT_EQ(error_of(R"({"replicas": null})"), "mesh spec: replicas = 'null'" + allowed);
  EXPECT_EQ(error_of(R"({"data": 1048577})"), "mesh spec: data = '1048577'" + allowed);
  EXPECT_EQ(error_of(R"({"data": 18446744073709551616})"), "mesh spec: data = '18446744073709551616'" + allowed);
  EXPECT_EQ(error_of("fsdp=0"), "mesh spec: fsdp = '0'" + allowed);
  EXPECT_EQ(error_of("fsdp=-1"), "mesh spec: fsdp = '-1'" + allowed);
  EXPECT_EQ(error_of("fsdp=2.5"), "mesh spec: fsdp = '2.5'" + allowed);
  EXPECT_EQ(error_of("fsdp=two"), "mesh spec: fsdp = 'two'" + allowed);
  EXPECT_EQ(error_of("fsdp="), "mesh spec: fsdp = ''" + allowed);
  EXPECT_EQ(error_of("stage=99999999999999999999"), "mesh spec: stage = '99999999999999999999'" + allowed);
  EXPECT_TRUE(parse_mesh_spec("data=1048576").ok());
}

TEST(MeshSpecTest, NestedValuesAreRefusedWithoutReadingThem) {
  const std::string allowed = "; allowed: a whole number from 1 to 1048576";
  EXPECT_EQ(error_of(R"({"fsdp": {"size": 2}})"), "mesh spec: fsdp is an object" + allowed);
  EXPECT_EQ(error_of(R"({"fsdp": [2]})"), "mesh spec: fsdp is an array" + allowed);
  // Deep nesting stops at the first level instead of recursing.
  EXPECT_EQ(error_of(R"({"fsdp": )" + std::string(100000, '[')), "mesh spec: fsdp is an array" + allowed);
}

TEST(MeshSpecTest, JsonOtherThanAnObjectIsRefused) {
  const std::string allowed = " is not allowed; allowed: a JSON object such as {\"fsdp\": 2, \"replicas\": 2}";
  EXPECT_EQ(error_of("[2, 2]"),
            "mesh spec: a JSON array is not allowed; allowed: a JSON object such as {\"fsdp\": 2, \"replicas\": 2}");
  EXPECT_EQ(parse_mesh_spec_json("2").error().message, "mesh spec: '2'" + allowed);
  EXPECT_EQ(parse_mesh_spec_json("\"fsdp\"").error().message, "mesh spec: '\"fsdp\"'" + allowed);
}

TEST(MeshSpecTest, BrokenJsonSaysWhere) {
  const std::string message = error_of(R"({"fsdp": 2)");
  EXPECT_THAT(message, StartsWith("mesh spec: invalid JSON: parse error at line 1, column 11:"));
  EXPECT_THAT(message, HasSubstr("unexpected end of input"));
  EXPECT_THAT(error_of(R"({"fsdp": 2} extra)"),
              StartsWith("mesh spec: invalid JSON: parse error at line 1, column 13:"));
  EXPECT_THAT(error_of("{fsdp: 2}"), StartsWith("mesh spec: invalid JSON: parse error at line 1, column 3:"));
  EXPECT_EQ(error_of("{\n\"fsdp\": 2,\n}").find('\n'), std::string::npos);
}

TEST(MeshSpecTest, PairsOtherThanAxisEqualsSizeAreRefused) {
  const std::string allowed =
      " is not axis=size; allowed: axis=size pairs separated by commas, such as fsdp=2,replicas=2";
  EXPECT_EQ(error_of("fsdp"), "mesh spec: 'fsdp' in 'fsdp'" + allowed);
  EXPECT_EQ(error_of("fsdp=2,"), "mesh spec: '' in 'fsdp=2,'" + allowed);
  EXPECT_EQ(error_of("fsdp=2,,tensor=2"), "mesh spec: '' in 'fsdp=2,,tensor=2'" + allowed);
  EXPECT_EQ(error_of("fsdp:2"), "mesh spec: 'fsdp:2' in 'fsdp:2'" + allowed);
}

TEST(ResolveShapeTest, DataTakesTheDevicesLeftOver) {
  auto shape = resolve_shape(parse_mesh_spec("fsdp=2,tensor=2").value(), 16);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape.value(), (MeshShape{4, 1, 2, 1, 2, 1}));
  // replicas is not an axis: it does not take devices.
  shape = resolve_shape(parse_mesh_spec("fsdp=2,replicas=2").value(), 8);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape.value(), (MeshShape{4, 1, 2, 1, 1, 1}));
  shape = resolve_shape(parse_mesh_spec("data=2,fsdp=4").value(), 8);
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape.value(), (MeshShape{2, 1, 4, 1, 1, 1}));
}

TEST(ResolveShapeTest, SizesThatDoNotFitTheDevicesAreRefusedWithTheNumbers) {
  EXPECT_EQ(resolve_shape(parse_mesh_spec("data=2,fsdp=2").value(), 8).error().message,
            "mesh spec: data=2 x fsdp=2 multiply to 4, but there are 8 devices; the sizes must multiply to the "
            "device count");
  EXPECT_EQ(resolve_shape(parse_mesh_spec("fsdp=3").value(), 8).error().message,
            "mesh spec: fsdp=3 asks for 3 devices, which does not divide the 8 devices; data takes the devices left "
            "over, so the other axes must multiply to a divisor of 8");
  EXPECT_EQ(resolve_shape(parse_mesh_spec("fsdp=4,tensor=4").value(), 8).error().message,
            "mesh spec: fsdp=4 x tensor=4 multiply to 16, which does not divide the 8 devices; data takes the "
            "devices left over, so the other axes must multiply to a divisor of 8");
  EXPECT_EQ(
      resolve_shape(parse_mesh_spec(R"({"data":1048576,"stage":1048576,"fsdp":1048576})").value(), 8).error().message,
      "mesh spec: data=1048576 x stage=1048576 x fsdp=1048576 multiply to more than 1099511627776, but "
      "there are 8 devices; the sizes must multiply to the device count");
  EXPECT_EQ(resolve_shape(MeshSpec{}, 0).error().message, "mesh: 0 devices to lay out; allowed: at least 1");
  MeshSpec zero;
  zero.sizes[kExpert] = 0;
  EXPECT_EQ(resolve_shape(zero, 8).error().message,
            "mesh spec: expert = '0' is not allowed; allowed: a whole number from 1 to 1048576");
}

}  // namespace
}  // namespace dew::mesh
