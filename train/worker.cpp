// run_worker: one thread per local device, the pool's mesh, and the report;
// report_json: the pool.json of the design page.
#include <nlohmann/json.hpp>

#include <mutex>
#include <thread>

#include "device.h"
#include "dew/train.h"

namespace dew::train {

Result<WorkerReport> run_worker(runtime::Pool& pool, const WorkerOptions& options,
                                const std::function<void(const StepRecord&)>& progress) {
  auto planned = plan_layout(options, pool.size());
  if (!planned.ok()) return planned.error();
  const mesh::Mesh& layout = planned.value();
  const int devices = options.devices_per_process;
  std::vector<Result<DeviceResult>> results(std::size_t(devices), Result<DeviceResult>(DeviceResult{}));
  std::vector<std::thread> threads;
  for (int d = 0; d < devices; ++d) {
    threads.emplace_back([&, d] {
      const int device = pool.rank() * devices + d;  // cpu_pool's ids: process by process
      const bool reports = pool.rank() == 0 && d == 0;
      results[std::size_t(d)] = train_device(pool, layout, options, device, reports ? progress : nullptr);
    });
  }
  for (auto& thread : threads) thread.join();
  for (int d = 0; d < devices; ++d) {
    if (!results[std::size_t(d)].ok()) {
      return results[std::size_t(d)].error().prefixed("device " + std::to_string(pool.rank() * devices + d) + ": ");
    }
  }
  const DeviceResult& first = results[0].value();
  WorkerReport report;
  report.mesh = layout;
  report.steps = first.steps;
  report.fsdp_groups = layout.groups[static_cast<int>(mesh::Axis::kFsdp)].processes;
  report.exchange = first.exchange;
  report.exchange_reason = first.exchange_reason;
  report.state_bytes_per_device = first.state_bytes;
  report.tokens_per_step = options.batch * options.model.length;
  return report;
}

std::string report_json(const WorkerReport& r, const WorkerOptions& o) {
  nlohmann::json j;
  std::vector<double> losses;
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : r.steps) {
    losses.push_back(s.loss);
    steps.push_back({{"step", s.step}, {"loss", s.loss}, {"seconds", s.seconds}, {"split", s.split}});
  }
  j["losses"] = losses;
  j["fsdp_groups"] = r.fsdp_groups;
  j["mesh"] = nlohmann::json::parse(mesh::mesh_to_json(r.mesh));
  j["exchange"] = r.exchange;
  if (!r.exchange_reason.empty()) j["exchange_reason"] = r.exchange_reason;
  j["steps"] = steps;
  j["state_bytes_per_device"] = r.state_bytes_per_device;
  j["tokens_per_step"] = r.tokens_per_step;
  j["dtype"] = o.dtype == Dtype::kFloat64 ? "fp64" : "fp32";
  j["model"] = {{"vocab", o.model.vocab},   {"width", o.model.width},       {"layers", o.model.layers},
                {"heads", o.model.heads},   {"kv_heads", o.model.kv_heads}, {"mlp", o.model.mlp},
                {"length", o.model.length}, {"batch", o.batch},             {"seed", o.seed}};
  return j.dump(2) + "\n";
}

}  // namespace dew::train
