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
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "build.h"
#include "dew/text.h"

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
  if (cell == "X")
    path = PathClass::kSelf;
  else if (cell == "PIX")
    path = PathClass::kPIX;
  else if (cell == "PXB")
    path = PathClass::kPXB;
  else if (cell == "PHB")
    path = PathClass::kPHB;
  else if (cell == "NODE")
    path = PathClass::kNODE;
  else if (cell == "SYS" || cell == "SOC")
    path = PathClass::kSYS;
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

// The matrix, read in steps: where it is, its columns, its GPU rows, the
// cells; each step an Error naming the line, or nothing.
class MatrixReader {
 public:
  MatrixReader(std::string_view content, std::string_view name) : label_(name) {
    for (const auto& line : split(content, '\n')) lines_.push_back(smi_words(line));
  }

  Result<Draft> read(std::string_view name) {
    if (auto bad = find_matrix()) return *bad;
    if (auto bad = read_columns()) return *bad;
    if (auto bad = collect_rows()) return *bad;
    Draft draft;
    if (auto bad = fill(draft)) return *bad;
    if (auto bad = check_symmetric(draft)) return *bad;
    bool has_numa_column = false;
    for (Named named : header_.named) has_numa_column = has_numa_column || named == Named::kNumaAffinity;
    if (!has_numa_column) draft.notes.push_back("no NUMA Affinity column (an older driver): NUMA nodes unknown");
    draft.source = "nvidia-smi topo -m text (" + base_name(name) + ")";
    draft.granule = "file:" + base_name(name);
    draft.notes.push_back("nvidia-smi text names no PCI bus ids, models or link speeds");
    if (gpu_columns_.empty()) draft.notes.push_back("no NVIDIA GPU found");
    return draft;
  }

 private:
  Error fail(std::size_t line, const std::string& problem) const {
    return invalid_argument(label_ + ": line " + std::to_string(line + 1) + ": " + problem);
  }

  // The first row "GPU0 X ..." and the header line above it.
  std::optional<Error> find_matrix() {
    first_row_ = lines_.size();
    for (std::size_t i = 0; i < lines_.size(); ++i) {
      if (lines_[i].size() >= 2 && lines_[i][0] == "GPU0" && lines_[i][1] == "X") {
        first_row_ = i;
        break;
      }
    }
    if (first_row_ == lines_.size()) return invalid_argument(label_ + ": no matrix row \"GPU0 X ...\" in the text");
    header_line_ = first_row_;
    for (std::size_t i = first_row_; i-- > 0;) {
      if (!lines_[i].empty()) {
        header_line_ = i;
        break;
      }
    }
    if (header_line_ == first_row_ || lines_[header_line_][0] != "GPU0") {
      return fail(first_row_, "the matrix has no header line above it (GPU0 GPU1 ... CPU Affinity)");
    }
    header_ = read_header(lines_[header_line_]);
    return std::nullopt;
  }

  // Every device column, and which of them are the GPUs, in order.
  std::optional<Error> read_columns() {
    for (std::size_t c = 0; c < header_.devices.size(); ++c) {
      if (!column_.emplace(header_.devices[c], c).second) {
        return fail(header_line_, "the header names " + printable(header_.devices[c]) + " twice");
      }
      int number = 0;
      if (!is_gpu_label(header_.devices[c], number)) continue;
      if (number != static_cast<int>(gpu_columns_.size())) {
        return fail(header_line_, "the header names " + header_.devices[c] + " where GPU" +
                                      std::to_string(gpu_columns_.size()) + " belongs");
      }
      gpu_columns_.push_back(c);
    }
    if (gpu_columns_.size() > kMaxGpus) {
      return fail(header_line_, "the header names " + std::to_string(gpu_columns_.size()) + " GPUs; allowed: at most " +
                                    std::to_string(kMaxGpus));
    }
    return std::nullopt;
  }

  // The GPU rows, up to the first blank line or the legend.
  std::optional<Error> collect_rows() {
    const std::size_t devices = header_.devices.size();
    rows_.assign(gpu_columns_.size(), {});
    row_line_.assign(gpu_columns_.size(), 0);
    for (std::size_t i = first_row_; i < lines_.size(); ++i) {
      const std::vector<std::string>& words = lines_[i];
      // The end: a blank line, the legend, or the closing fence of a
      // Markdown code block (``` or ~~~) pasted with it.
      if (words.empty() || words[0] == "Legend:" || (words.size() > 1 && words[1] == "Legend:") ||
          words[0].rfind("```", 0) == 0 || words[0].rfind("~~~", 0) == 0) {
        break;
      }
      if (column_.find(words[0]) == column_.end()) {
        return fail(i, "row '" + printable(words[0]) + "' is not a device the header names");
      }
      if (words.size() < 1 + devices) {
        return fail(i, "row " + printable(words[0]) + " has " + std::to_string(words.size() - 1) +
                           " cells; the header names " + std::to_string(devices) + " devices (truncated?)");
      }
      int number = 0;
      if (!is_gpu_label(words[0], number)) continue;  // NIC rows: not GPU paths
      const auto g = static_cast<std::size_t>(number);
      if (!rows_[g].empty()) return fail(i, "a second row for " + words[0]);
      rows_[g] = words;
      row_line_[g] = i;
    }
    return std::nullopt;
  }

  std::string cell(std::size_t g, std::size_t h) const { return rows_[g][1 + gpu_columns_[h]]; }

  // The path classes, NVLink counts, CPU and NUMA affinity of every GPU.
  std::optional<Error> fill(Draft& draft) const {
    const std::size_t n = gpu_columns_.size();
    draft.given_path.assign(n * n, PathClass::kUnknown);
    draft.given_nvlinks.assign(n * n, 0);
    std::set<int> numa_nodes;
    for (std::size_t g = 0; g < n; ++g) {
      if (rows_[g].empty()) {
        return invalid_argument(label_ + ": the matrix has no row for GPU" + std::to_string(g) + " (truncated?)");
      }
      for (std::size_t h = 0; h < n; ++h) {
        PathClass path = PathClass::kUnknown;
        int links = 0;
        const std::string where =
            "GPU" + std::to_string(g) + "/GPU" + std::to_string(h) + " cell '" + printable(cell(g, h));
        if (!read_cell(cell(g, h), path, links)) {
          return fail(row_line_[g], where + "' is not one of X, NV#, PIX, PXB, PHB, NODE, SYS");
        }
        if ((path == PathClass::kSelf) != (g == h)) {
          return fail(row_line_[g],
                      where + (g == h ? "' must be X (the GPU itself)" : "' is X away from the diagonal"));
        }
        draft.given_path[g * n + h] = path;
        draft.given_nvlinks[g * n + h] = links;
      }
      draft.gpus.push_back(site_of(rows_[g]));
      if (draft.gpus.back().gpu.numa_node) numa_nodes.insert(*draft.gpus.back().gpu.numa_node);
    }
    draft.numa_nodes = static_cast<int>(numa_nodes.size());
    return std::nullopt;
  }

  GpuSite site_of(const std::vector<std::string>& row) const {
    GpuSite site;
    std::size_t at = 1 + header_.devices.size();
    for (Named named : header_.named) {
      if (at >= row.size()) break;
      const std::string& value = row[at++];
      if (named == Named::kCpuAffinity && value != "N/A") site.gpu.cpu_affinity = value;
      if (named == Named::kNumaAffinity) site.gpu.numa_node = numa_number(value);
    }
    return site;
  }

  std::optional<Error> check_symmetric(const Draft& draft) const {
    const std::size_t n = gpu_columns_.size();
    for (std::size_t g = 0; g < n; ++g) {
      for (std::size_t h = g + 1; h < n; ++h) {
        if (draft.given_path[g * n + h] == draft.given_path[h * n + g] &&
            draft.given_nvlinks[g * n + h] == draft.given_nvlinks[h * n + g]) {
          continue;
        }
        return fail(row_line_[h], "GPU" + std::to_string(h) + "/GPU" + std::to_string(g) + " says '" +
                                      printable(cell(h, g)) + "' but GPU" + std::to_string(g) + "/GPU" +
                                      std::to_string(h) + " says '" + printable(cell(g, h)) + "'");
      }
    }
    return std::nullopt;
  }

  std::string label_;
  std::vector<std::vector<std::string>> lines_;
  std::size_t first_row_ = 0;
  std::size_t header_line_ = 0;
  Header header_;
  std::map<std::string, std::size_t> column_;  // device label -> column
  std::vector<std::size_t> gpu_columns_;
  std::vector<std::vector<std::string>> rows_;  // GPU g's row, words
  std::vector<std::size_t> row_line_;
};

}  // namespace

Result<Draft> read_nvidia_smi_text(std::string_view content, std::string_view name) {
  return MatrixReader(content, name).read(name);
}

}  // namespace dew::topology::detail
