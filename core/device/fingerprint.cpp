// node_fingerprint (fingerprint.h): a digest of what the kernel says of the node's GPUs.
#include "device/fingerprint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "base/build_info.h"
#include "base/fd.h"
#include "base/sha256.h"

namespace cupool {

namespace {

constexpr std::size_t kMaxFileBytes = 64 << 10;
constexpr std::size_t kMaxNames = 4096;

std::optional<std::string> read_small(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  std::string text(kMaxFileBytes, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

// The entries of `dir` (no "." and ".."), sorted; empty when it can't be read.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != ".." && out.size() < kMaxNames) out.push_back(name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Every name under `dir`, depth first, relative, at most `budget` in all.
void names_under(const std::string& dir, const std::string& prefix, std::size_t& budget, std::string& out) {
  for (const std::string& name : entries(dir)) {
    if (budget == 0) return;
    --budget;
    out += prefix + name + "\n";
    const std::string path = dir + "/" + name;
    if (!entries(path).empty()) names_under(path, prefix + name + "/", budget, out);
  }
}

}  // namespace

std::string node_fingerprint(const std::string& root, const std::function<std::optional<std::string>(const char*)>& env,
                             const std::string& build) {
  const std::string base = root == "/" ? "" : root;
  const auto boot = read_small(base + "/proc/sys/kernel/random/boot_id");
  auto module = read_small(base + "/sys/module/nvidia/version");
  if (!module) module = read_small(base + "/proc/driver/nvidia/version");
  const std::string gpus_dir = base + "/proc/driver/nvidia/gpus";
  const std::vector<std::string> gpus = entries(gpus_dir);
  if (!boot || boot->empty() || !module || module->empty() || gpus.empty()) return "";
  std::string text = "cupool node fingerprint 1\nbuild " + build + "\nboot " + *boot + "\nmodule " + *module + "\n";
  for (const std::string& gpu : gpus) {
    const auto info = read_small(gpus_dir + "/" + gpu + "/information");
    text += "gpu " + gpu + "\n" + info.value_or("(unreadable)\n");
  }
  std::size_t budget = kMaxNames;
  text += "capabilities\n";
  names_under(base + "/proc/driver/nvidia/capabilities", "", budget, text);
  for (const char* name : kDeviceEnvironment) {
    const auto value = env(name);
    text += std::string("env ") + name + (value ? "=" + *value : std::string(" unset")) + "\n";
  }
  return "sha256:" + sha256_hex(text);
}

std::string this_node_fingerprint() {
  return node_fingerprint(
      "/",
      [](const char* name) -> std::optional<std::string> {
        const char* v = std::getenv(name);
        return v ? std::optional<std::string>(v) : std::nullopt;
      },
      build_info().version + " " + build_info().commit);
}

}  // namespace cupool
