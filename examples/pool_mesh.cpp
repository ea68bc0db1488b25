// A program built against an installed libdew alone:
//
//   c++ -std=c++20 pool_mesh.cpp $(pkg-config --cflags --libs dew) -o pool_mesh
//   dew launch --processes-per-host 2 -- ./pool_mesh
//
// Every process joins the pool, agrees with its peers, lays a mesh of
// fsdp=2 over the pool's devices (two CPU devices per process, each a
// thread) and, for every one of its devices, makes the communicator of the
// device's data-axis group and all-reduces the device's id over it: the data
// axis crosses processes, so the sum travels over TCP between them.
#include <dew/axes.h>
#include <dew/mesh.h>
#include <dew/pool.h>

#include <cstdio>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kDevicesPerProcess = 2;

// One device: its data-axis group's communicator, and the sum of the
// group's device ids.
std::string all_reduce_on_data_axis(dew::runtime::Pool& pool, const dew::mesh::Mesh& mesh, int device) {
  auto member = dew::axes::axis_member(mesh, dew::mesh::Axis::kData, device);
  auto comm = dew::axes::make_axis_communicator(pool, mesh, dew::mesh::Axis::kData, device);
  if (!member.ok() || !comm.ok()) return "error: " + (member.ok() ? comm.error() : member.error()).message;
  std::vector<double> value{static_cast<double>(device)};
  if (auto done = comm.value()->all_reduce(std::span<double>(value)); !done.ok())
    return "error: " + done.error().message;
  std::string group;
  for (const int id : member.value().devices) group += (group.empty() ? "" : " + ") + std::to_string(id);
  return "device " + std::to_string(device) + ": data group " + group + " = " + std::to_string(int(value[0]));
}

}  // namespace

int main() {
  auto pool = dew::runtime::join();
  pool.agree("started");

  auto spec = dew::mesh::parse_mesh_spec("fsdp=2");
  auto mesh = dew::mesh::build_mesh(spec.value(), dew::mesh::cpu_pool(pool.size(), kDevicesPerProcess));
  if (!mesh.ok()) pool.fail(mesh.error().message);

  std::vector<std::string> lines(kDevicesPerProcess);
  std::vector<std::thread> devices;
  for (int d = 0; d < kDevicesPerProcess; ++d) {
    devices.emplace_back([&, d] {
      lines[d] =
          all_reduce_on_data_axis(pool, mesh.value(), dew::mesh::cpu_device_id(pool.rank(), kDevicesPerProcess, d));
    });
  }
  for (auto& device : devices) device.join();
  for (const auto& line : lines) {
    if (line.rfind("error: ", 0) == 0) pool.fail(line.substr(7));
    std::printf("%s\n", line.c_str());
  }
  pool.agree("done");
  return 0;
}
