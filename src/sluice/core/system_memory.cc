#include "sluice/core/system_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace sluice {

namespace {

// The "<key>: <n> kB" line of a /proc file, in bytes; -1 when the file or the key is missing.
int64_t ReadKilobytes(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kb = -1;
    if (fields >> kb && kb >= 0) return kb * 1024;
    return -1;
  }
  return -1;
}

}  // namespace

SystemMemory ReadSystemMemory() {
  SystemMemory m;
  m.available_bytes = ReadKilobytes("/proc/meminfo", "MemAvailable");
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    m.address_limit_bytes = static_cast<int64_t>(limit.rlim_cur);
  }
  m.address_used_bytes = std::max<int64_t>(0, ReadKilobytes("/proc/self/status", "VmSize"));
  m.peak_resident_bytes = ReadKilobytes("/proc/self/status", "VmHWM");
  return m;
}

}  // namespace sluice
