// The coordination service's frames and handshake MACs.
#include "wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "auth.h"

namespace {

using namespace dew::runtime;
using ::testing::HasSubstr;

TEST(Wire, RoundTripsEveryTypeAtEveryCut) {
  const wire::Frame frame{wire::Type::kGathered,
                          {wire::encode_u64(7), "", std::string("a\0b", 3), std::string(70000, 'z')}};
  const std::string bytes = wire::encode(frame) + wire::encode({wire::Type::kHeartbeat, {}});
  for (std::size_t cut = 0; cut < wire::kHeaderBytes + 20; ++cut) {
    EXPECT_EQ(wire::decode(bytes.substr(0, cut), wire::kMaxFrameBytes).status, wire::DecodeStatus::kNeedMore) << cut;
  }
  auto first = wire::decode(bytes, wire::kMaxFrameBytes);
  ASSERT_EQ(first.status, wire::DecodeStatus::kFrame);
  EXPECT_EQ(first.frame.type, wire::Type::kGathered);
  EXPECT_EQ(first.frame.items, frame.items);
  auto second = wire::decode(std::string_view(bytes).substr(first.consumed), wire::kMaxFrameBytes);
  ASSERT_EQ(second.status, wire::DecodeStatus::kFrame);
  EXPECT_EQ(second.frame.type, wire::Type::kHeartbeat);
  EXPECT_EQ(first.consumed + second.consumed, bytes.size());
}

TEST(Wire, NumbersAreEightBytes) {
  EXPECT_EQ(wire::decode_u64(wire::encode_u64(0x0102030405060708ULL)), 0x0102030405060708ULL);
  EXPECT_FALSE(wire::decode_u64("1234567").has_value());
}

struct BadFrame {
  const char* name;
  std::string bytes;
  const char* error;
};

class Refused : public ::testing::TestWithParam<BadFrame> {};

TEST_P(Refused, WithOneLineSayingWhy) {
  auto decoded = wire::decode(GetParam().bytes, 4096);
  ASSERT_EQ(decoded.status, wire::DecodeStatus::kBad);
  EXPECT_THAT(decoded.error, HasSubstr(GetParam().error));
}

INSTANTIATE_TEST_SUITE_P(
    Frames, Refused,
    ::testing::Values(BadFrame{"empty", std::string("\0\0\0\0", 4), "empty frame"},
                      BadFrame{"oversized", std::string("\x7f\xff\xff\xff", 4),
                               "frame of 2147483647 bytes is over the limit of 4096"},
                      BadFrame{"unknown_type", std::string("\0\0\0\x01\x63", 5), "unknown frame type 99"},
                      BadFrame{"type_zero", std::string("\0\0\0\x01\x00", 5), "unknown frame type 0"},
                      BadFrame{"http", "GET / HTTP/1.1\r\n", "over the limit"},
                      BadFrame{"item_overruns", std::string("\0\0\0\x06\x05\0\0\0\x09z", 10), "overruns"},
                      BadFrame{"truncated_item_length", std::string("\0\0\0\x03\x05\0\0", 7), "truncated item length"},
                      BadFrame{"too_few_items", wire::encode({wire::Type::kHeartbeat, {}}).replace(4, 1, "\x05"),
                               "put frame with 0 items (allowed: 2)"},
                      BadFrame{"too_many_items", wire::encode({wire::Type::kBye, {"x"}}),
                               "bye frame with 1 items (allowed: 0)"}),
    [](const ::testing::TestParamInfo<BadFrame>& info) { return std::string(info.param.name); });

TEST(Auth, MacsBindTheSecretTheNonceAndTheIdentity) {
  ASSERT_TRUE(auth::ready());
  const std::string nonce = auth::random_nonce();
  EXPECT_EQ(nonce.size(), auth::kNonceBytes);
  EXPECT_NE(nonce, auth::random_nonce());
  const std::string mac = auth::hello_mac("secret", nonce, 1, 4);
  EXPECT_TRUE(auth::same_mac(mac, auth::hello_mac("secret", nonce, 1, 4)));
  EXPECT_FALSE(auth::same_mac(mac, auth::hello_mac("secreT", nonce, 1, 4)));
  EXPECT_FALSE(auth::same_mac(mac, auth::hello_mac("secret", auth::random_nonce(), 1, 4)));
  EXPECT_FALSE(auth::same_mac(mac, auth::hello_mac("secret", nonce, 2, 4)));
  EXPECT_FALSE(auth::same_mac(mac, auth::hello_mac("secret", nonce, 1, 5)));
  EXPECT_FALSE(auth::same_mac(mac, auth::welcome_mac("secret", nonce)));
  EXPECT_FALSE(auth::same_mac(mac, mac.substr(1)));
}

// The service tags a gather's reply from its head and the hash of the
// shared parts it computed once; the client tags the whole frame it read.
// Both must agree, and any change of key, sequence number or byte must not.
TEST(FrameTags, AHeadAndTailHashTagEqualsTheWholeFramesAndChangesWithEveryInput) {
  const auto keys = auth::frame_keys("secret", std::string(32, 'n'), std::string(32, 'c'), 1);
  EXPECT_EQ(keys.to_service.size(), auth::kKeyBytes);
  EXPECT_NE(keys.to_service, keys.to_client);
  EXPECT_NE(auth::frame_keys("secret", std::string(32, 'n'), std::string(32, 'd'), 1).to_service, keys.to_service);
  EXPECT_NE(auth::frame_keys("secret", std::string(32, 'n'), std::string(32, 'c'), 2).to_service, keys.to_service);
  EXPECT_NE(auth::frame_keys("secreT", std::string(32, 'n'), std::string(32, 'c'), 1).to_service, keys.to_service);

  const std::vector<std::string> parts = {"first part", std::string(70000, 'x'), ""};
  std::string tail = wire::encode_items(parts);
  const std::string head = wire::encode_head(wire::Type::kGathered, {wire::encode_u64(9)}, tail.size());
  const std::string frame = head + tail;
  EXPECT_EQ(wire::head_bytes(frame), head.size());
  // The service hashes with the pool's tail key; every direction's key ends with it.
  EXPECT_EQ(keys.to_client.substr(auth::kTagKeyBytes), auth::tail_key("secret"));
  EXPECT_EQ(keys.to_service.substr(auth::kTagKeyBytes), auth::tail_key("secret"));
  EXPECT_NE(auth::tail_key("secreT"), auth::tail_key("secret"));
  auth::TailHasher hasher(auth::tail_key("secret"));
  hasher.add(tail.substr(0, 5));
  hasher.add(tail.substr(5));
  const auto tag = auth::frame_tag(keys.to_client, 3, head, hasher.finish());
  EXPECT_EQ(tag, auth::frame_tag(keys.to_client, 3, frame));
  EXPECT_NE(tag, auth::frame_tag(keys.to_client, 4, frame));
  EXPECT_NE(tag, auth::frame_tag(keys.to_service, 3, frame));
  for (std::size_t at : {std::size_t{0}, std::size_t{4}, head.size() - 1, head.size() + 7, frame.size() - 1}) {
    std::string changed = frame;
    changed[at] = static_cast<char>(changed[at] ^ 1);
    EXPECT_NE(tag, auth::frame_tag(keys.to_client, 3, changed)) << "byte " << at;
  }
  EXPECT_TRUE(auth::same_tag(tag, std::string(reinterpret_cast<const char*>(tag.data()), tag.size())));
  EXPECT_FALSE(auth::same_tag(tag, ""));
}

TEST(FrameTags, AFramesHeadIsItsFirstItemOrItsTypeByte) {
  EXPECT_EQ(wire::head_bytes(wire::encode({wire::Type::kHeartbeat, {}})), wire::kHeaderBytes + 1);
  EXPECT_EQ(wire::head_bytes(wire::encode({wire::Type::kPut, {"key", "value"}})), wire::kHeaderBytes + 1 + 4 + 3);
  // Never past the bytes given, whatever they claim.
  EXPECT_EQ(wire::head_bytes(std::string("\0\0\0\x09\x05\xff\xff\xff\xff", 9)), 9U);
  EXPECT_EQ(wire::head_bytes("ab"), 2U);
}

}  // namespace
