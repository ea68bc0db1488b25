// Which topology format a file is in, from its content: users pass whatever
// they saved (`lstopo x.xml`, NCCL_TOPO_DUMP_FILE, a pasted matrix), and the
// file name says nothing reliable.
#include <string>
#include <string_view>

#include "build.h"
#include "dew/topology.h"

namespace dew::topology {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

std::string_view skip_space(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && is_space(text[i])) ++i;
  return text.substr(i);
}

}  // namespace

namespace detail {

// The name of the first element of an XML document, skipping the
// declaration, comments and a DOCTYPE; empty when there is none.
std::string_view xml_root_name(std::string_view text) {
  while (true) {
    text = skip_space(text);
    if (text.substr(0, 4) == "<!--") {
      std::size_t end = text.find("-->", 4);
      if (end == std::string_view::npos) return {};
      text.remove_prefix(end + 3);
    } else if (text.substr(0, 2) == "<?") {
      std::size_t end = text.find("?>", 2);
      if (end == std::string_view::npos) return {};
      text.remove_prefix(end + 2);
    } else if (text.substr(0, 2) == "<!") {
      // <!DOCTYPE ...> with an optional [internal subset].
      int depth = 0;
      std::size_t i = 2;
      for (; i < text.size(); ++i) {
        if (text[i] == '[') ++depth;
        if (text[i] == ']') --depth;
        if (text[i] == '>' && depth <= 0) break;
      }
      if (i >= text.size()) return {};
      text.remove_prefix(i + 1);
    } else if (text.substr(0, 1) == "<") {
      std::size_t i = 1;
      while (i < text.size() && !is_space(text[i]) && text[i] != '>' && text[i] != '/') ++i;
      return text.substr(1, i - 1);
    } else {
      return {};
    }
  }
}

std::vector<std::string> smi_words(std::string_view line) {
  // A paste copied from a script's comments (# on every line) or from a
  // quoted reply (> on every line): the markers are no cell of the matrix.
  std::size_t first = 0;
  while (first < line.size() && (is_space(line[first]) || line[first] == '#' || line[first] == '>')) ++first;
  line.remove_prefix(first);
  std::string clean;
  clean.reserve(line.size());
  for (std::size_t i = 0; i < line.size(); ++i) {
    const bool escape = line[i] == '\x1b';
    // ESC [ digits ; m, or the same without the ESC where a paste dropped it.
    std::size_t j = escape ? i + 1 : i;
    if (j < line.size() && line[j] == '[') {
      std::size_t k = j + 1;
      while (k < line.size() && ((line[k] >= '0' && line[k] <= '9') || line[k] == ';')) ++k;
      if (k < line.size() && line[k] == 'm' && (escape || k > j + 1)) {
        clean += ' ';
        i = k;
        continue;
      }
    }
    if (escape) {
      clean += ' ';
      continue;
    }
    clean += line[i];
  }
  std::vector<std::string> words;
  std::size_t i = 0;
  while (i < clean.size()) {
    while (i < clean.size() && is_space(clean[i])) ++i;
    std::size_t start = i;
    while (i < clean.size() && !is_space(clean[i])) ++i;
    if (i > start) words.emplace_back(clean.substr(start, i - start));
  }
  return words;
}

}  // namespace detail

TopologyFormat detect_topology_format(std::string_view content) {
  if (content.substr(0, 3) == "\xEF\xBB\xBF") content.remove_prefix(3);  // UTF-8 byte order mark
  std::string_view start = skip_space(content);
  if (start.substr(0, 1) == "<") {
    std::string_view root = detail::xml_root_name(start);
    if (root == "topology") return TopologyFormat::kHwlocXml;
    if (root == "system") return TopologyFormat::kNcclXml;
    return TopologyFormat::kUnknown;
  }
  // nvidia-smi's first matrix row: "GPU0  X  NV4 ..." (the diagonal first).
  std::size_t begin = 0;
  while (begin < content.size()) {
    std::size_t end = content.find('\n', begin);
    if (end == std::string_view::npos) end = content.size();
    std::vector<std::string> words = detail::smi_words(content.substr(begin, end - begin));
    if (words.size() >= 2 && words[0] == "GPU0" && words[1] == "X") return TopologyFormat::kNvidiaSmiText;
    begin = end + 1;
  }
  return TopologyFormat::kUnknown;
}

std::string_view format_name(TopologyFormat format) {
  switch (format) {
    case TopologyFormat::kHwlocXml:
      return "hwloc XML";
    case TopologyFormat::kNcclXml:
      return "NCCL topology XML";
    case TopologyFormat::kNvidiaSmiText:
      return "nvidia-smi topo -m text";
    case TopologyFormat::kUnknown:
      break;
  }
  return "unknown";
}

std::string path_class_label(PathClass path, int nvlinks) {
  switch (path) {
    case PathClass::kSelf:
      return "X";
    case PathClass::kNVLink:
      return "NV" + std::to_string(nvlinks);
    case PathClass::kPIX:
      return "PIX";
    case PathClass::kPXB:
      return "PXB";
    case PathClass::kPHB:
      return "PHB";
    case PathClass::kNODE:
      return "NODE";
    case PathClass::kSYS:
      return "SYS";
    case PathClass::kUnknown:
      break;
  }
  return "?";
}

}  // namespace dew::topology
