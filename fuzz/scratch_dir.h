// A scratch folder for fuzz targets whose code under test reads files by path: made once per
// process under the temporary directory, removed at exit.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace sluice::fuzz {

// The folder ("<tmp>/<name>.XXXXXX"); aborts when it cannot be made. Its string is never
// destroyed, so that the exit handler can still read it.
inline const std::string& ScratchDir(const char* name) {
  static const std::string* const dir = [name] {
    auto* d = new std::string(
        (std::filesystem::temp_directory_path() / (std::string(name) + ".XXXXXX")).string());
    if (::mkdtemp(d->data()) == nullptr) {
      std::fprintf(stderr, "%s: cannot make a scratch directory %s\n", name, d->c_str());
      std::abort();
    }
    std::atexit([] { std::filesystem::remove_all(*dir); });
    return d;
  }();
  return *dir;
}

// Writes `bytes` to `path` (replacing it); aborts when it cannot.
inline void WriteScratchFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write the scratch file %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace sluice::fuzz
