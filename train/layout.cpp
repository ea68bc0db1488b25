// The worker's layout: the mesh over the pool's devices, checked against
// the model and the batch before any process trains, and each device's place.
#include "layout.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dew/attention.h"
#include "dew/axes.h"
#include "dew/exchange.h"
#include "dew/text.h"
#include "params.h"

namespace dew::train {
namespace {

int size_of(const mesh::Mesh& m, mesh::Axis axis) { return m.shape[static_cast<int>(axis)]; }

// The model's own rules, and how the axes divide it.
Result<Done> check_model(const WorkerOptions& o, const mesh::Mesh& m) {
  const ModelConfig& c = o.model;
  const auto bad = [](const std::string& what) { return invalid_argument(what); };
  if (c.vocab < 2 || c.width < 1 || c.layers < 1 || c.heads < 1 || c.kv_heads < 1 || c.mlp < 1 || c.length < 2) {
    return bad("the model needs vocab >= 2, length >= 2 and width, layers, heads, kv heads and mlp >= 1");
  }
  if (c.width % c.heads != 0 || c.heads % c.kv_heads != 0) {
    return bad("width " + std::to_string(c.width) + " and heads " + std::to_string(c.heads) + "/" +
               std::to_string(c.kv_heads) + ": the width must divide by the heads and the heads by the kv heads");
  }
  const int data = size_of(m, mesh::Axis::kData), fsdp = size_of(m, mesh::Axis::kFsdp);
  const int tensor = size_of(m, mesh::Axis::kTensor), sequence = size_of(m, mesh::Axis::kSequence);
  if (o.batch < 1 || o.batch % (data * fsdp) != 0) {
    return bad("--batch " + std::to_string(o.batch) + " does not split over data " + std::to_string(data) + " x fsdp " +
               std::to_string(fsdp) + " = " + std::to_string(data * fsdp) + " devices; allowed: a multiple of " +
               std::to_string(data * fsdp));
  }
  if (c.kv_heads % tensor != 0 || c.mlp % tensor != 0) {
    return bad("tensor " + std::to_string(tensor) + " must divide the kv heads (" + std::to_string(c.kv_heads) +
               ") and the mlp's units (" + std::to_string(c.mlp) + ")");
  }
  if (c.length % sequence != 0) {
    return bad("the length " + std::to_string(c.length) + " does not split over sequence " + std::to_string(sequence) +
               "; allowed: a multiple of " + std::to_string(sequence));
  }
  return Done{};
}

// This machine's memory (the edge: sysconf), in bytes.
long double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<long double>(pages) * page : 0;
}

// Refuses a model the process's devices cannot hold (issue 26: huge sizes
// ended in a bare std::bad_alloc), before anything is allocated.
Result<Done> check_memory(const WorkerOptions& o, const mesh::Mesh& m, long double memory) {
  const long double need = estimated_process_bytes(o, m);
  if (memory <= 0 || need <= memory) return Done{};
  const auto gib = [](long double bytes) { return std::to_string(static_cast<long long>(bytes / (1LL << 30))); };
  return invalid_argument("the model needs about " + gib(need) + " GiB on each process (" +
                          counted(o.devices_per_process, "device") +
                          ": weights, gradients, AdamW state and activations at 8 bytes a value, and the dataset of "
                          "--steps x --batch sequences), more than this machine's " +
                          gib(memory) +
                          " GiB; allowed: a smaller --width, --mlp, --layers, --vocab, --length or --steps, or more "
                          "fsdp, tensor or processes");
}

}  // namespace

bool may_be_a_peers_failure(const Error& error) {
  return error.code == ErrorCode::kUnavailable || error.code == ErrorCode::kTimeout ||
         error.code == ErrorCode::kPeerFailed;
}

long double estimated_process_bytes(const WorkerOptions& o, const mesh::Mesh& m) {
  const int data = size_of(m, mesh::Axis::kData), fsdp = size_of(m, mesh::Axis::kFsdp);
  const int tensor = size_of(m, mesh::Axis::kTensor), sequence = size_of(m, mesh::Axis::kSequence);
  // One device's tensor part of every parameter, in values: the model's
  // parameters at one and at two layers give the part outside the layers
  // and one layer's, so a huge --layers is estimated without listing every
  // layer's parameters (2^31 layers took 40 s and ended in std::bad_alloc).
  const auto part_at = [&](int layers) {
    ModelConfig few = o.model;
    few.layers = layers;
    long double values = 0;
    for (const auto& bucket : model_buckets(few)) {
      for (const auto& spec : bucket)
        values += static_cast<long double>(local_rows(spec, tensor)) * local_cols(spec, tensor);
    }
    return values;
  };
  const long double one = part_at(1), layer = part_at(2) - one;
  const long double part = one + layer * (o.model.layers - 1);
  // Its fsdp share of the parameters, gradients and AdamW's two moments,
  // and the whole part gathered for use; activations: a few values per
  // position, unit and layer.
  const ModelConfig& c = o.model;
  const long double positions = static_cast<long double>(o.batch) / (data * fsdp) * c.length / sequence;
  const long double activations = positions * (c.width + static_cast<long double>(c.mlp) / tensor) * c.layers * 16;
  const long double per_device = (part * 4 / fsdp + part + activations) * 8;
  // The tokenized dataset, whole on every process: steps x batch x (length + 1).
  const long double dataset = static_cast<long double>(o.steps) * o.batch * (c.length + 1) * sizeof(std::int32_t);
  return per_device * o.devices_per_process + dataset;
}

Result<attention::Plan> plan_exchange(const WorkerOptions& o, int sequence, int tensor) {
  if (o.exchange != "auto" && o.exchange != "all-to-all" && o.exchange != "gather") {
    return not_allowed("--exchange", o.exchange, "auto, all-to-all or gather");
  }
  attention::Call call;
  call.heads = o.model.heads;
  call.kv_heads = o.model.kv_heads;
  call.query_length = call.key_length = o.model.length;
  call.sequence = sequence;
  call.tensor = tensor;
  call.mask.kind = attention::MaskKind::kCausal;
  call.head_dim = o.model.width / o.model.heads;
  call.bytes_per_value = o.dtype == Dtype::kFloat64 ? 8 : 4;
  call.gather_kernel = attention::GatherKernel::kSkipsMaskedBlocks;
  auto plan = attention::choose_exchange(call);
  if (!plan.ok() || o.exchange == "auto" || sequence == 1) return plan;
  attention::Plan forced = plan.value();
  const bool gather = o.exchange == "gather";
  const attention::ExchangeCost& cost = gather ? forced.gather : forced.all_to_all;
  if (!cost.can_run) {
    return invalid_argument("--exchange " + o.exchange + " cannot run over sequence " + std::to_string(sequence) +
                            " x tensor " + std::to_string(tensor) + ": " + cost.why_not +
                            "; allowed: auto (the rule picks " +
                            std::string(attention::exchange_name(forced.exchange)) + ")");
  }
  const auto picked = forced.exchange;
  forced.exchange = gather ? attention::Exchange::kGather : attention::Exchange::kAllToAll;
  forced.reason = "forced by --exchange (the rule picks " + std::string(attention::exchange_name(picked)) + ": " +
                  plan.value().reason + ")";
  return forced;
}

Result<mesh::Mesh> plan_layout(const WorkerOptions& o, int processes) {
  if (o.devices_per_process < 1 || o.devices_per_process > 1024) {
    return invalid_argument("--devices-per-process " + std::to_string(o.devices_per_process) +
                            " is not allowed; allowed: a whole number from 1 to 1024");
  }
  if (o.steps < 1)
    return invalid_argument("--steps " + std::to_string(o.steps) + " is not allowed; allowed: 1 or more");
  // Issue 26: --learning-rate nan trained NaN to the end and exited 0.
  if (!std::isfinite(o.learning_rate) || o.learning_rate <= 0) {
    std::ostringstream given;
    given << o.learning_rate;
    return invalid_argument("--learning-rate " + given.str() + " is not allowed; allowed: a finite number above 0");
  }
  auto spec = o.mesh.empty() ? Result<mesh::MeshSpec>(mesh::MeshSpec{}) : mesh::parse_mesh_spec(o.mesh);
  if (!spec.ok()) return spec.error().prefixed("--mesh: ");
  for (auto axis : {mesh::Axis::kExpert, mesh::Axis::kStage}) {
    const auto size = spec.value().sizes[static_cast<int>(axis)];
    if (size && *size > 1) {
      return unsupported("--mesh: " + std::string(mesh::kMeshAxes[static_cast<int>(axis)]) + "=" +
                         std::to_string(*size) + ": the worker's model has no experts and no pipeline stages; " +
                         "allowed: data, fsdp, tensor, sequence and replicas");
    }
  }
  std::optional<std::vector<int>> order;
  if (!o.devices.empty()) {
    auto ids = mesh::parse_device_order(o.devices);
    if (!ids.ok()) return ids.error().prefixed("--devices: ");
    order = ids.value();
  }
  auto built = mesh::build_mesh(spec.value(), mesh::cpu_pool(processes, o.devices_per_process), order);
  if (!built.ok()) {
    return built.error().prefixed("--mesh over " + counted(processes * o.devices_per_process, "device") + " (" +
                                  counted(processes, "process", "processes") + " x " +
                                  std::to_string(o.devices_per_process) + "): ");
  }
  if (auto fits = check_model(o, built.value()); !fits.ok()) return fits.error();
  if (auto fits = check_memory(o, built.value(), physical_memory()); !fits.ok()) return fits.error();
  const int sequence = size_of(built.value(), mesh::Axis::kSequence);
  if (sequence > 1) {
    if (auto plan = plan_exchange(o, sequence, size_of(built.value(), mesh::Axis::kTensor)); !plan.ok()) {
      return plan.error().prefixed("--mesh: ");
    }
  }
  return built;
}

Result<DevicePlace> place_of(const mesh::Mesh& m, const WorkerOptions& o, int device) {
  DevicePlace p;
  p.device = device;
  const auto member = [&](mesh::Axis axis, AxisPlace& place) -> Result<Done> {
    auto got = axes::axis_member(m, axis, device);
    if (!got.ok()) return got.error();
    place = AxisPlace{got.value().rank, got.value().size};
    return Done{};
  };
  for (auto [axis, place] :
       {std::pair{mesh::Axis::kData, &p.data}, std::pair{mesh::Axis::kFsdp, &p.fsdp},
        std::pair{mesh::Axis::kTensor, &p.tensor}, std::pair{mesh::Axis::kSequence, &p.sequence}}) {
    if (auto r = member(axis, *place); !r.ok()) return r.error();
  }
  p.batch_rank = p.data.rank * p.fsdp.size + p.fsdp.rank;
  p.sequences = o.batch / (p.data.size * p.fsdp.size);
  p.first_sequence = p.batch_rank * p.sequences;
  // The exchanges' own cut of the sequence (contiguous shards).
  auto positions =
      attention::shard_positions(attention::Layout::kContiguous, o.model.length, p.sequence.size, p.sequence.rank);
  if (!positions.ok()) return positions.error();
  p.positions = std::move(positions.value());
  return p;
}

}  // namespace dew::train
