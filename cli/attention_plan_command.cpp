// `dew attention-plan`: which sequence-parallel exchange an attention call
// takes on a mesh, why, and the bytes each exchange would send.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "dew/attention.h"

namespace dew::cli {
namespace {

struct PlanOptions {
  attention::Call call;
  std::int64_t kv_length = 0;  // 0: the query length
  std::string mask = "none";
  std::string gather_kernel = "dense-bias";
};

std::string size_text(double bytes) {
  char buffer[96];
  std::snprintf(buffer, sizeof buffer, "%.0f bytes (%.4g MiB)", bytes, bytes / (1024.0 * 1024.0));
  return buffer;
}

std::string units_text(double units) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", units);
  return buffer;
}

void print_cost(std::string_view name, const attention::ExchangeCost& cost, std::ostream& out) {
  out << "  " << name << (name.size() < 10 ? std::string(10 - name.size(), ' ') : "") << "  ";
  if (!cost.can_run) {
    out << "cannot run: " << cost.why_not << "\n";
    return;
  }
  out << units_text(cost.units) << " units, " << size_text(cost.bytes) << "\n";
}

int run(PlanOptions options) {
  const auto fail = [](const Error& error) { return report(error); };
  auto mask = attention::parse_mask_kind(options.mask);
  if (!mask.ok()) return fail(mask.error());
  auto gather_kernel = attention::parse_gather_kernel(options.gather_kernel);
  if (!gather_kernel.ok()) return fail(gather_kernel.error());
  attention::Call& call = options.call;
  call.mask = mask.value();
  call.gather_kernel = gather_kernel.value();
  call.key_length = options.kv_length == 0 ? call.query_length : options.kv_length;
  auto plan = attention::choose_exchange(call);
  if (!plan.ok()) return fail(plan.error());
  const attention::Plan& p = plan.value();
  std::cout << "exchange  " << attention::exchange_name(p.exchange) << "\n"
            << "reason    " << p.reason << "\n"
            << "call      heads " << call.heads << ", kv heads " << call.kv_heads << ", length " << call.query_length
            << ", kv length " << call.key_length << ", sequence " << call.sequence << ", tensor " << call.tensor
            << ", mask " << attention::format_mask_kind(call.mask) << ", head dim " << call.head_dim << ", "
            << call.bytes_per_value << " bytes per value, gather kernel "
            << attention::gather_kernel_name(call.gather_kernel) << "\n"
            << "heads     per tensor shard: " << p.shard_heads << " query, " << p.shard_kv_heads << " key";
  if (p.all_to_all.can_run) std::cout << "; the all-to-all repeats key heads to K' = " << p.repeated_kv_heads;
  std::cout << "\n"
            << "sends     per device, one forward call, in units of length x head width x (N-1)/N and in bytes:\n";
  print_cost("all-to-all", p.all_to_all, std::cout);
  print_cost("gather", p.gather, std::cout);
  return 0;
}

}  // namespace

void add_attention_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command = app.add_subcommand(
      "attention-plan",
      "Which exchange a sequence-parallel attention call takes (all-to-all or gather), why, and the bytes each "
      "would send per device");
  command->add_option("--heads", options->call.heads, "Query heads H, over all tensor shards")->required();
  command->add_option("--kv-heads", options->call.kv_heads, "Key/value heads K (a divisor of H)")->required();
  command->add_option("--length", options->call.query_length, "Query length of the whole sequence")->required();
  command->add_option("--kv-length", options->kv_length, "Key length when it differs (cross attention)");
  command->add_option("--sequence", options->call.sequence, "The mesh's sequence axis N")->required();
  command->add_option("--tensor", options->call.tensor, "The mesh's tensor axis T (default 1)");
  command->add_option("--mask", options->mask,
                      "none, causal, documents, window=W (W positions back) or window=LEFT,RIGHT (default none)");
  command->add_option("--head-dim", options->call.head_dim, "Head width (default 128)");
  command->add_option("--bytes-per-value", options->call.bytes_per_value, "Bytes per value (default 2: bf16)");
  command->add_option("--gather-kernel", options->gather_kernel,
                      "How the gather's kernel runs a mask: dense-bias (cuDNN-like: every logit, so masked calls "
                      "take the all-to-all; the design page's rule; default) or skips-masked-blocks (Dew's CPU kernel: "
                      "masked calls are decided by bytes, like unmasked ones)");
  command->callback([options] { run_subcommand("attention-plan", [&] { return run(*options); }); });
}

}  // namespace dew::cli
