// Reading a topology file: read it whole, check it is well-formed, hand it to
// the reader for its format, assemble. Every failure is one line naming the
// file and the problem.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <pugixml.hpp>
#include <string>

#include "build.h"
#include "dew/topology.h"

namespace dew::topology {
namespace {

// Real topology files are tens to hundreds of KiB; hwloc XML of a 1000-core
// machine with every I/O device stays under a few MiB.
constexpr std::uintmax_t kMaxFileBytes = 64u << 20;

constexpr std::string_view kExpected = "expected hwloc XML, NCCL topology XML or the text of `nvidia-smi topo -m`";

// hwloc 2.9 checks that an object's sets come in pairs (a cpuset with its
// complete_cpuset, a nodeset with its complete_nodeset, no nodeset without a
// cpuset) for files of version 1 only, and then relies on it for every
// file: an object of a version 2 file with a cpuset but no complete_cpuset
// crashes it (found by topology_loaders_fuzz). Checked here for every file,
// so hwloc reads only files it can, in this process.
std::optional<Error> check_hwloc_sets(const pugi::xml_node& object, const std::string& name) {
  const auto has = [&](const char* attribute) { return static_cast<bool>(object.attribute(attribute)); };
  const auto refuse = [&](const std::string& problem) {
    return invalid_argument(name + ": <object type=\"" + detail::printable(object.attribute("type").value()) + "\"> " +
                            problem +
                            "; allowed: cpuset with complete_cpuset, nodeset with complete_nodeset (as lstopo writes "
                            "them), or none");
  };
  if (has("cpuset") != has("complete_cpuset")) {
    return refuse(has("cpuset") ? "has a cpuset but no complete_cpuset" : "has a complete_cpuset but no cpuset");
  }
  if (has("nodeset") != has("complete_nodeset")) {
    return refuse(has("nodeset") ? "has a nodeset but no complete_nodeset" : "has a complete_nodeset but no nodeset");
  }
  if (has("nodeset") && !has("cpuset")) return refuse("has a nodeset but no cpuset");
  return std::nullopt;
}

// Bounds hwloc does not check and pays for in memory and time: a PU or NUMA
// node without os_index makes hwloc set bit 2^32-1 of a bitmap (512 MiB, and
// seconds), and a distance matrix of n objects holds n^2 values. And the
// sets hwloc relies on (check_hwloc_sets).
std::optional<Error> check_hwloc_bounds(const pugi::xml_node& root, const std::string& name) {
  constexpr unsigned long kMaxOsIndex = 1ul << 20;        // a million PUs or NUMA nodes
  constexpr unsigned long long kMaxMatrixObjects = 1024;  // a DGX-2 has 28, an NVL72 rack ~110
  // Every element, depth first, without recursion (the nesting is the file's).
  for (pugi::xml_node node = root.first_child(); node;) {
    const std::string tag = node.name();
    const std::string type = node.attribute("type").value();
    if (tag == "object") {
      if (auto problem = check_hwloc_sets(node, name)) return problem;
    }
    if (tag == "object" && (type == "PU" || type == "NUMANode")) {
      const pugi::xml_attribute index = node.attribute("os_index");
      const std::string text = index.value();
      const bool digits =
          !text.empty() && text.size() <= 7 && text.find_first_not_of("0123456789") == std::string::npos;
      if (!index || !digits || std::stoul(text) >= kMaxOsIndex) {
        return invalid_argument(name + ": <object type=\"" + type + "\" os_index=\"" + detail::printable(text) +
                                "\"> is not allowed; allowed: an os_index from 0 to " +
                                std::to_string(kMaxOsIndex - 1));
      }
    }
    if (tag == "distances" || tag == "distances2" || tag == "distances2hetero") {
      const unsigned long long count = node.attribute("nbobjs").as_ullong(0);
      if (count > kMaxMatrixObjects) {
        return invalid_argument(name + ": <" + tag + " nbobjs=\"" + std::to_string(count) +
                                "\"> is not allowed; allowed: at most " + std::to_string(kMaxMatrixObjects) +
                                " objects");
      }
    }
    if (node.first_child()) {
      node = node.first_child();
      continue;
    }
    while (node && node != root && !node.next_sibling()) node = node.parent();
    if (!node || node == root) break;
    node = node.next_sibling();
  }
  return std::nullopt;
}

Result<detail::Draft> read_xml(std::string_view content, const std::string& name) {
  pugi::xml_document document;
  pugi::xml_parse_result parsed =
      document.load_buffer(content.data(), content.size(), pugi::parse_default, pugi::encoding_utf8);
  if (!parsed) {
    // A file cut short (a copy that stopped, a paste that lost its tail) is
    // the usual cause: say so when the root element is never closed.
    // pugixml may place an error at the end of input one past its last byte.
    const auto offset = std::min(static_cast<std::size_t>(parsed.offset), content.size());
    const std::string where = " at byte " + std::to_string(offset) + " of " + std::to_string(content.size());
    const std::string root(detail::xml_root_name(content));
    const std::size_t last = content.find_last_not_of(" \t\r\n");
    const std::string_view tail = content.substr(0, last == std::string_view::npos ? 0 : last + 1);
    const std::string closing = "</" + root + ">";
    const bool closed =
        !root.empty() && tail.size() >= closing.size() && tail.substr(tail.size() - closing.size()) == closing;
    if (!closed) {
      const std::string missing = root.empty() ? "its root element" : detail::printable(closing);
      return invalid_argument(name + ": truncated XML: it ends before " + missing + " (" + parsed.description() +
                              where + ")");
    }
    return invalid_argument(name + ": malformed XML" + where + ": " + parsed.description());
  }
  pugi::xml_node root = document.document_element();
  const std::string root_name = root.name();
  if (root_name == "topology") {
    // hwloc 2.x writes version="2.0", hwloc 3 "3.0"; 1.x wrote no version
    // at all. read_hwloc_xml refuses a major version past the hwloc here.
    const int version = root.attribute("version") ? std::max(root.attribute("version").as_int(2), 2) : 1;
    if (auto error = check_hwloc_bounds(root, name)) return *error;
    return detail::read_hwloc_xml(content, name, version);
  }
  if (root_name == "system") return detail::read_nccl_xml(content, name);
  return invalid_argument(name + ": XML root element <" + detail::printable(root_name) +
                          "> is neither hwloc's <topology> nor NCCL's <system>; " + std::string(kExpected));
}

}  // namespace

Result<Topology> parse_topology_text(std::string_view content, std::string_view name) {
  const std::string label(name);
  if (content.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return invalid_argument(label + ": empty file; " + std::string(kExpected));
  }
  std::string_view start = content.substr(content.find_first_not_of(" \t\r\n"));
  if (start.substr(0, 3) == "\xEF\xBB\xBF") start.remove_prefix(3);

  Result<detail::Draft> draft = Error{};
  if (start.substr(0, 1) == "<") {
    draft = read_xml(content, label);
  } else if (detect_topology_format(content) == TopologyFormat::kNvidiaSmiText) {
    draft = detail::read_nvidia_smi_text(content, label);
  } else {
    return invalid_argument(label + ": not a topology file; " + std::string(kExpected));
  }
  if (!draft.ok()) return draft.error();
  if (draft.value().gpus.size() > detail::kMaxGpus) {
    return invalid_argument(label + ": " + std::to_string(draft.value().gpus.size()) +
                            " GPUs is not allowed; allowed: at most " + std::to_string(detail::kMaxGpus) +
                            " in one topology");
  }
  return detail::assemble(std::move(draft.value()));
}

namespace {

// A FIFO, a device or a process substitution that says nothing for this
// long is given up on (issue 26: a FIFO with no writer blocked for ever).
constexpr int kQuietReadMs = 10000;

// The file's bytes, at most kMaxFileBytes: the limit holds for what is
// read, not only for what a regular file says its size is (a device such as
// /dev/zero, a FIFO or a process substitution has no size and may never
// end), and a source that stays silent is bounded by kQuietReadMs.
Result<std::string> read_bounded(const std::string& path, const std::string& too_large) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return system_error(path + ": cannot read: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string content;
  char chunk[1 << 16];
  for (;;) {
    pollfd ready{fd, POLLIN, 0};
    const int polled = ::poll(&ready, 1, kQuietReadMs);
    if (polled < 0 && errno == EINTR) continue;
    if (polled < 0) return system_error(path + ": cannot read: " + std::strerror(errno));
    if (polled == 0) {
      return unavailable(path + ": nothing to read within " + std::to_string(kQuietReadMs / 1000) +
                         " s (a FIFO or device that nobody writes); allowed: a topology file, or a pipe that is "
                         "written, such as <(nvidia-smi topo -m)");
    }
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return system_error(path + ": cannot read: " + std::strerror(errno));
    if (got == 0) return content;
    content.append(chunk, static_cast<std::size_t>(got));
    if (content.size() > kMaxFileBytes) {
      return invalid_argument(path + ": more than " + std::to_string(kMaxFileBytes >> 20) + " MiB read, which" +
                              too_large);
    }
  }
}

}  // namespace

Result<Topology> load_topology_file(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error) {
    const std::string what = path + ": cannot read: " + error.message();
    return error == std::errc::no_such_file_or_directory ? not_found(what) : system_error(what);
  }
  if (std::filesystem::is_directory(status)) return invalid_argument(path + ": cannot read: it is a directory");
  const std::string too_large =
      " is too large for a topology file; allowed: up to " + std::to_string(kMaxFileBytes >> 20) + " MiB";
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  if (!error && size > kMaxFileBytes)
    return invalid_argument(path + ": " + std::to_string(size >> 20) + " MiB" + too_large);
  auto content = read_bounded(path, too_large);
  if (!content.ok()) return content.error();
  const std::string& text = content.value();
  return parse_topology_text(text, path);
}

}  // namespace dew::topology
