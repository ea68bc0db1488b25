#include "step_verdict.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <span>

#include "dew/hex.h"
#include "dew/text.h"

namespace dew::spank {
namespace {

constexpr std::string_view kMagic = "dew-failure-notice";
constexpr std::string_view kVersion = "2";
// A rank's line from classify_task_end, and a node's name, are short; the
// bound keeps a notice within kFailureNoticeMaxBytes.
constexpr std::size_t kLineMaxBytes = 600;
constexpr std::size_t kNodeMaxBytes = 255;

std::string mac_hex(std::string_view text, std::string_view secret) {
  if (sodium_init() < 0) return {};  // HMAC needs no entropy: cannot happen; an empty MAC matches nothing
  std::array<unsigned char, crypto_auth_hmacsha256_BYTES> mac{};
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  crypto_auth_hmacsha256_final(&state, mac.data());
  return to_hex(mac);
}

std::string hex_of(std::string_view text) {
  return to_hex(std::span(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}

std::string step_text(std::uint32_t job, std::uint32_t step) {
  return std::to_string(job) + "." + std::to_string(step);
}

Error bad_notice(std::string_view what) {
  return invalid_argument("failure notice refused: " + std::string(what) +
                          "; allowed: a notice of this step from one of its nodes");
}

}  // namespace

std::string encode_failure_notice(const FailureNotice& notice, std::uint32_t job, std::uint32_t step,
                                  std::string_view secret) {
  const std::string body = std::string(kMagic) + " " + std::string(kVersion) + " " + step_text(job, step) + " " +
                           std::to_string(notice.rank) + " " + std::to_string(notice.exit_code) + " " +
                           std::to_string(std::max<std::int64_t>(notice.ended_at_us, 0)) + " " +
                           hex_of(std::string_view(notice.node).substr(0, kNodeMaxBytes)) + " " +
                           hex_of(std::string_view(notice.line).substr(0, kLineMaxBytes));
  return body + " " + mac_hex(body, secret) + "\n";
}

Result<FailureNotice> decode_failure_notice(std::string_view text, std::uint32_t job, std::uint32_t step,
                                            std::string_view secret) {
  if (text.size() > kFailureNoticeMaxBytes) return bad_notice("longer than " + std::to_string(kFailureNoticeMaxBytes));
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  const auto fields = split(text, ' ');
  if (fields.size() != 9 || fields[0] != kMagic) return bad_notice("not a failure notice: " + quoted(text));
  if (fields[1] != kVersion) return bad_notice("version " + quoted(fields[1]) + ", not " + std::string(kVersion));
  const auto body = text.substr(0, text.rfind(' '));
  const std::string expected = mac_hex(body, secret);
  if (fields[8].size() != expected.size() || sodium_memcmp(expected.data(), fields[8].data(), expected.size()) != 0) {
    return bad_notice("not tagged with this step's pool secret");
  }
  if (fields[2] != step_text(job, step))
    return bad_notice("of step " + quoted(fields[2]) + ", not " + step_text(job, step));
  FailureNotice notice;
  const auto rank = parse_whole<std::uint32_t>(fields[3]);
  const auto code = parse_whole<int>(fields[4]);
  const auto at = parse_whole<std::int64_t>(fields[5]);
  auto node = from_hex(fields[6]);
  auto line = from_hex(fields[7]);
  if (!rank || !code || *code > 255 || !at || !node || !line) {
    return bad_notice("a field that does not parse: " + quoted(text));
  }
  notice.rank = *rank;
  notice.exit_code = *code;
  notice.ended_at_us = *at;
  notice.node = one_line(*node);
  notice.line = one_line(*line);
  return notice;
}

std::optional<std::string> StepVerdict::add(FailureNotice notice) {
  if (said_) return after_line(notice);
  notices_.push_back(std::move(notice));
  return std::nullopt;
}

std::optional<StepVerdict::Lines> StepVerdict::say() {
  if (said_ || notices_.empty()) return std::nullopt;
  said_ = true;
  // stable: of two notices at the same time, the one that arrived first.
  std::stable_sort(notices_.begin(), notices_.end(),
                   [](const FailureNotice& a, const FailureNotice& b) { return a.ended_at_us < b.ended_at_us; });
  first_ = notices_.front();
  Lines lines;
  lines.named = *first_;
  lines.rank = first_->rank;
  lines.verdict = first_->line + "; node " + first_->node;
  if (notices_.size() > 1) {
    lines.verdict +=
        "; the first of " + std::to_string(notices_.size()) + " nodes' failures (the others ended after it)";
  }
  for (std::size_t k = 1; k < notices_.size(); ++k) lines.after.push_back(after_line(notices_[k]));
  return lines;
}

std::string StepVerdict::after_line(const FailureNotice& later) const {
  // "rank 1 ended with exit code 1" -> "rank 1 on n1 also ended with exit code 1"
  std::string what = later.line.substr(0, later.line.find(';'));
  const auto ended = what.find(" ended ");
  if (ended != std::string::npos) what.replace(ended, 7, " on " + later.node + " also ended ");
  if (!first_) return what;
  const auto after_us = std::max<std::int64_t>(later.ended_at_us - first_->ended_at_us, 0);
  const std::string after = after_us < 1'000'000 ? std::to_string((after_us + 500) / 1000) + " ms"
                                                 : seconds_text(static_cast<double>(after_us) / 1e6);
  return "after rank " + std::to_string(first_->rank) + "'s failure, " + what + ", " + after +
         " later: not named as the step's failure";
}

}  // namespace dew::spank
