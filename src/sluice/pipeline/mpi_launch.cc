#include "sluice/pipeline/mpi_launch.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"
#include "sluice/core/tensor.h"

namespace sluice::pipeline {
namespace {

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> parts;
  std::stringstream in(list);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

// Root's `text` on every rank: its length, then its bytes, each an AllReduceSum of f32 (bytes and
// lengths below 2^24 are exact).
std::string ShareText(Communicator& world, int root, const std::string& text) {
  const bool is_root = world.rank() == root;
  Tensor length = Tensor::Zeros({1}, DType::kF32);
  if (is_root) length.data<float>()[0] = static_cast<float>(text.size());
  world.AllReduceSum(length);
  const auto n = static_cast<int64_t>(length.data<float>()[0]);
  if (n == 0) return "";
  Tensor bytes = Tensor::Zeros({n}, DType::kF32);
  if (is_root) {
    for (int64_t i = 0; i < n; ++i)
      bytes.data<float>()[i] = static_cast<unsigned char>(text[static_cast<size_t>(i)]);
  }
  world.AllReduceSum(bytes);
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>(static_cast<int>(bytes.data<float>()[i]));
  return out;
}

// Settings as text, one "name\tvalue" a line.
std::string Serialize(const LaunchSettings& settings) {
  std::string text;
  for (const auto& [name, value] : settings) text += name + '\t' + value + '\n';
  return text;
}

std::string Show(const std::string& name, const std::string& value) {
  if (name == "version") return value.empty() ? "no version" : value;
  return value.empty() ? fmt::format("{} unset", name) : fmt::format("{} {}", name, value);
}

}  // namespace

void CheckSameLaunch(Communicator& world, const LaunchSettings& mine) {
  const std::string leader = ShareText(world, 0, Serialize(mine));
  // This rank's first difference from rank 0, as a message.
  std::string differs;
  if (Serialize(mine) != leader) {
    std::map<std::string, std::string> theirs;
    std::vector<std::string> order;
    std::stringstream in(leader);
    for (std::string line; std::getline(in, line);) {
      const size_t tab = line.find('\t');
      const std::string name = line.substr(0, tab);
      theirs[name] = tab == std::string::npos ? "" : line.substr(tab + 1);
      order.push_back(name);
    }
    for (const auto& [name, value] : mine) {
      auto it = theirs.find(name);
      const std::string other = it == theirs.end() ? "" : it->second;
      if (it == theirs.end() || other != value) {
        differs = fmt::format("rank {} was started with {} but rank 0 with {}", world.rank(),
                              Show(name, value),
                              it == theirs.end() ? "no such option" : Show(name, other));
        break;
      }
    }
    if (differs.empty()) {  // rank 0 has a setting this rank lacks
      for (const std::string& name : order) {
        if (std::none_of(mine.begin(), mine.end(),
                         [&](const auto& s) { return s.first == name; })) {
          differs = fmt::format("rank {} has no option {}, which rank 0 was started with",
                                world.rank(), name);
          break;
        }
      }
    }
  }
  // Which ranks differ: the first of them tells every rank why.
  Tensor flags = Tensor::Zeros({world.size()}, DType::kF32);
  flags.data<float>()[world.rank()] = differs.empty() ? 0 : 1;
  world.AllReduceSum(flags);
  for (int r = 0; r < world.size(); ++r) {
    if (flags.data<float>()[r] == 0) continue;
    throw InvalidArgument(fmt::format(
        "{}: every rank must run the same sluice with the same options (check the mpirun "
        "command line and that every host has the same sluice)",
        ShareText(world, r, differs)));
  }
}

std::string TransportBetween(bool same_host, const MpiTransportSettings& settings) {
  // A pml other than ob1 moves the messages itself ("^ucx" only excludes one).
  if (!settings.pml.empty() && !settings.pml.starts_with('^') && settings.pml != "ob1")
    return settings.pml;
  const std::vector<std::string> btl = SplitList(settings.btl);
  if (btl.empty() || btl.front().starts_with('^')) return "Open MPI's choice (btl unset)";
  auto has = [&](const char* name) { return std::find(btl.begin(), btl.end(), name) != btl.end(); };
  const std::string tcp =
      settings.tcp_interfaces.empty() ? "tcp" : fmt::format("tcp ({})", settings.tcp_interfaces);
  if (same_host) {
    if (has("vader")) return "shared memory (vader)";
    if (has("sm")) return "shared memory (sm)";
    if (has("tcp")) return tcp;
  }
  std::vector<std::string> network;
  for (const std::string& b : btl) {
    if (b != "self" && b != "vader" && b != "sm") network.push_back(b == "tcp" ? tcp : b);
  }
  if (network.empty()) return fmt::format("none (btl {} reaches no other host)", settings.btl);
  return fmt::format("{}", fmt::join(network, " or "));
}

std::string DescribeRankPlacement(const std::vector<std::string>& hosts, int rank, int stages,
                                  int replicas, const MpiTransportSettings& settings) {
  SLUICE_CHECK(static_cast<int>(hosts.size()) == stages * replicas && rank >= 0 &&
               rank < stages * replicas);
  const int stage = rank % stages, replica = rank / stages;
  // Peers, in the order of the pipeline then the replicas, each with why it is one.
  std::vector<std::pair<int, std::string>> peers;
  if (stage > 0) peers.emplace_back(rank - 1, "previous stage");
  if (stage + 1 < stages) peers.emplace_back(rank + 1, "next stage");
  for (int r = 0; r < replicas; ++r) {
    if (r != replica) peers.emplace_back(r * stages + stage, fmt::format("replica {}", r));
  }
  // Grouped by transport, in the order each first appears.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& [peer, why] : peers) {
    const std::string transport = TransportBetween(hosts[peer] == hosts[rank], settings);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == transport; });
    if (it == groups.end()) it = groups.insert(groups.end(), {transport, {}});
    it->second.push_back(fmt::format("rank {} on {} ({})", peer, hosts[peer], why));
  }
  std::string line = fmt::format("sluice: rank {} of {} on host {}: stage {}, replica {}", rank,
                                 stages * replicas, hosts[rank], stage, replica);
  if (groups.empty()) return line + ", no peers";
  for (const auto& [transport, to] : groups)
    line += fmt::format(", {} to {}", transport, fmt::join(to, " and "));
  return line;
}

}  // namespace sluice::pipeline
