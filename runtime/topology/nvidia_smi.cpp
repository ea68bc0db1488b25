// The text of `nvidia-smi topo -m`, as users paste it into issues and chats:
//
//   	GPU0	GPU1	NIC0	CPU Affinity	NUMA Affinity	GPU NUMA ID
//   GPU0	 X 	NV4	PHB	0-11,24-35	0		N/A
//   GPU1	NV4	 X 	PHB	0-11,24-35	0		N/A
//   NIC0	PHB	PHB	 X
//
//   Legend: ...
//
// Cells are separated by tabs, or by spaces once a web page has had it;
// drivers differ in the named columns (CPU Affinity only, NUMA Affinity,
// GPU NUMA ID) and in NIC columns (NIC0 or mlx5_0), and the header may carry
// terminal escapes. So: split on any whitespace, take the device columns
// from the header, and read the named columns by their names.
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "build.h"

namespace dew::topology::detail {
namespace {

enum class Named { kCpuAffinity, kNumaAffinity, kGpuNumaId, kOther };

struct Header {
  std::vector<std::string> devices;  // column order: GPU0.., NIC0.. or mlx5_0..
  std::vector<Named> named;          // the columns after the devices
};

bool is_gpu_label(const std::string& word, int& number) {
  if (word.size() < 4 || word.compare(0, 3, "GPU") != 0 || word.size() > 8) return false;
  number = 0;
  for (std::size_t i = 3; i < word.size(); ++i) {
    if (word[i] < '0' || word[i] > '9') return false;
    number = number * 10 + (word[i] - '0');
  }
  return true;
}

Header read_header(const std::vector<std::string>& words) {
  Header header;
  std::size_t i = 0;
  for (; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "CPU" || w == "NUMA" || w == "GPU") break;
    header.devices.push_back(w);
  }
  while (i < words.size()) {
    auto next_is = [&](std::initializer_list<const char*> phrase) {
      std::size_t k = 0;
      for (const char* word : phrase) {
        if (i + k >= words.size() || words[i + k] != word) return false;
        ++k;
      }
      return true;
    };
    if (next_is({"CPU", "Affinity"})) {
      header.named.push_back(Named::kCpuAffinity);
      i += 2;
    } else if (next_is({"NUMA", "Affinity"})) {
      header.named.push_back(Named::kNumaAffinity);
      i += 2;
    } else if (next_is({"GPU", "NUMA", "ID"})) {
      header.named.push_back(Named::kGpuNumaId);
      i += 3;
    } else {
      header.named.push_back(Named::kOther);
      i += 1;
    }
  }
  return header;
}

// One cell: X, NV#, PIX, PXB, PHB, NODE, SYS (SOC: SYS before driver 384).
bool read_cell(const std::string& cell, PathClass& path, int& links) {
  links = 0;
  if (cell == "X") path = PathClass::kSelf;
  else if (cell == "PIX") path = PathClass::kPIX;
  else if (cell == "PXB") path = PathClass::kPXB;
  else if (cell == "PHB") path = PathClass::kPHB;
  else if (cell == "NODE") path = PathClass::kNODE;
  else if (cell == "SYS" || cell == "SOC") path = PathClass::kSYS;
  else if (cell.size() > 2 && cell.size() <= 6 && cell.compare(0, 2, "NV") == 0) {
    for (std::size_t i = 2; i < cell.size(); ++i) {
      if (cell[i] < '0' || cell[i] > '9') return false;
      links = links * 10 + (cell[i] - '0');
    }
    if (links < 1 || links > 1024) return false;
    path = PathClass::kNVLink;
  } else {
    return false;
  }
  return true;
}

std::optional<int> numa_number(const std::string& text) {
  if (text.empty() || text.size() > 6) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return std::atoi(text.c_str());
}

}  // namespace

Result<Draft> read_nvidia_smi_text(std::string_view content, std::string_view name) {
  const std::string label(name);
  auto fail = [&](std::size_t line, const std::string& problem) {
    return invalid_argument(label + ": line " + std::to_string(line + 1) + ": " + problem);
  };

  std::vector<std::vector<std::string>> lines;
  for (std::size_t begin = 0; begin <= content.size();) {
    std::size_t end = content.find('\n', begin);
    if (end == std::string_view::npos) end = content.size();
    lines.push_back(smi_words(content.substr(begin, end - begin)));
    begin = end + 1;
  }

  std::size_t first_row = lines.size();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].size() >= 2 && lines[i][0] == "GPU0" && lines[i][1] == "X") {
      first_row = i;
      break;
    }
  }
  if (first_row == lines.size()) return invalid_argument(label + ": no matrix row \"GPU0 X ...\" in the text");
  std::size_t header_line = first_row;
  for (std::size_t i = first_row; i-- > 0;) {
    if (!lines[i].empty()) {
      header_line = i;
      break;
    }
  }
  if (header_line == first_row || lines[header_line][0] != "GPU0") {
    return fail(first_row, "the matrix has no header line above it (GPU0 GPU1 ... CPU Affinity)");
  }
  const Header header = read_header(lines[header_line]);
  std::map<std::string, std::size_t> column;  // device label -> column
  std::vector<std::size_t> gpu_columns;
  for (std::size_t c = 0; c < header.devices.size(); ++c) {
    if (!column.emplace(header.devices[c], c).second) {
      return fail(header_line, "the header names " + printable(header.devices[c]) + " twice");
    }
    int number = 0;
    if (is_gpu_label(header.devices[c], number)) {
      if (number != static_cast<int>(gpu_columns.size())) {
        return fail(header_line, "the header names " + header.devices[c] + " where GPU" +
                                     std::to_string(gpu_columns.size()) + " belongs");
      }
      gpu_columns.push_back(c);
    }
  }
  const std::size_t n = gpu_columns.size();
  const std::size_t devices = header.devices.size();
  if (n > kMaxGpus) {
    return fail(header_line, "the header names " + std::to_string(n) + " GPUs; allowed: at most " +
                                 std::to_string(kMaxGpus));
  }

  std::vector<std::vector<std::string>> rows(n);
  std::vector<std::size_t> row_line(n, 0);
  for (std::size_t i = first_row; i < lines.size(); ++i) {
    const std::vector<std::string>& words = lines[i];
    if (words.empty() || words[0] == "Legend:" || (words.size() > 1 && words[1] == "Legend:")) break;
    auto it = column.find(words[0]);
    if (it == column.end()) {
      return fail(i, "row '" + printable(words[0]) + "' is not a device the header names");
    }
    if (words.size() < 1 + devices) {
      return fail(i, "row " + printable(words[0]) + " has " + std::to_string(words.size() - 1) +
                         " cells; the header names " + std::to_string(devices) + " devices (truncated?)");
    }
    int number = 0;
    if (!is_gpu_label(words[0], number)) continue;  // NIC rows: not GPU paths
    const auto g = static_cast<std::size_t>(number);
    if (!rows[g].empty()) return fail(i, "a second row for " + words[0]);
    rows[g] = words;
    row_line[g] = i;
  }

  Draft draft;
  draft.given_path.assign(n * n, PathClass::kUnknown);
  draft.given_nvlinks.assign(n * n, 0);
  std::set<int> numa_nodes;
  for (std::size_t g = 0; g < n; ++g) {
    if (rows[g].empty()) {
      return invalid_argument(label + ": the matrix has no row for GPU" + std::to_string(g) + " (truncated?)");
    }
    for (std::size_t h = 0; h < n; ++h) {
      const std::string& cell = rows[g][1 + gpu_columns[h]];
      PathClass path = PathClass::kUnknown;
      int links = 0;
      if (!read_cell(cell, path, links)) {
        return fail(row_line[g], "GPU" + std::to_string(g) + "/GPU" + std::to_string(h) + " cell '" + printable(cell) +
                                     "' is not one of X, NV#, PIX, PXB, PHB, NODE, SYS");
      }
      if ((path == PathClass::kSelf) != (g == h)) {
        return fail(row_line[g], "GPU" + std::to_string(g) + "/GPU" + std::to_string(h) + " cell '" + printable(cell) +
                                     (g == h ? "' must be X (the GPU itself)" : "' is X away from the diagonal"));
      }
      draft.given_path[g * n + h] = path;
      draft.given_nvlinks[g * n + h] = links;
    }
    GpuSite site;
    std::size_t at = 1 + devices;
    for (Named named : header.named) {
      if (at >= rows[g].size()) break;
      const std::string& value = rows[g][at++];
      if (named == Named::kCpuAffinity && value != "N/A") site.gpu.cpu_affinity = value;
      if (named == Named::kNumaAffinity) site.gpu.numa_node = numa_number(value);
    }
    if (site.gpu.numa_node) numa_nodes.insert(*site.gpu.numa_node);
    draft.gpus.push_back(std::move(site));
  }
  for (std::size_t g = 0; g < n; ++g) {
    for (std::size_t h = g + 1; h < n; ++h) {
      if (draft.given_path[g * n + h] != draft.given_path[h * n + g] ||
          draft.given_nvlinks[g * n + h] != draft.given_nvlinks[h * n + g]) {
        return fail(row_line[h], "GPU" + std::to_string(h) + "/GPU" + std::to_string(g) + " says '" +
                                     printable(rows[h][1 + gpu_columns[g]]) + "' but GPU" + std::to_string(g) + "/GPU" +
                                     std::to_string(h) + " says '" + printable(rows[g][1 + gpu_columns[h]]) + "'");
      }
    }
  }

  draft.numa_nodes = static_cast<int>(numa_nodes.size());
  bool has_numa_column = false;
  for (Named named : header.named) has_numa_column = has_numa_column || named == Named::kNumaAffinity;
  if (!has_numa_column) draft.notes.push_back("no NUMA Affinity column (an older driver): NUMA nodes unknown");
  draft.source = "nvidia-smi topo -m text (" + base_name(name) + ")";
  draft.granule = "file:" + base_name(name);
  draft.notes.push_back("nvidia-smi text names no PCI bus ids, models or link speeds");
  if (n == 0) draft.notes.push_back("no NVIDIA GPU found");
  return draft;
}

}  // namespace dew::topology::detail
