// DriverStart (driver_start.h): the driver's part of the holder's start, off the serving thread.
#include "holder/driver_start.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <stdexcept>

#include "base/text.h"
#include "device/query.h"

namespace cupool {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

DriverStart::DriverStart(Backend& backend, bool ask_node, std::vector<AdoptedPart> parts, std::vector<int> devices)
    : done_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (!done_fd_) throw std::runtime_error("eventfd: " + errno_text());
  thread_ = std::thread([this, &backend, ask_node, parts = std::move(parts), devices = std::move(devices)] {
    run(backend, ask_node, parts, devices);
  });
}

DriverStart::~DriverStart() {
  if (thread_.joinable()) thread_.join();
}

void DriverStart::run(Backend& backend, bool ask_node, const std::vector<AdoptedPart>& parts,
                      const std::vector<int>& devices) {
  try {
    auto at = Clock::now();
    backend.init();
    result_.init_ms = ms_since(at);
    if (ask_node) {
      at = Clock::now();
      result_.node = build_report(backend);
      result_.node_ms = ms_since(at);
    }
    at = Clock::now();
    result_.checks = verify_adopted(backend, parts);
    result_.adopt_ms = ms_since(at);
    at = Clock::now();
    std::set<int> opened;
    for (const AdoptedPart& p : parts) opened.insert(p.device);  // mapping opened these
    for (int d : devices)
      if (opened.insert(d).second) backend.open_device(d);
    result_.devices_ms = ms_since(at);
  } catch (...) {
    result_.failure = std::current_exception();
  }
  done_ = true;
  const std::uint64_t one = 1;
  (void)!::write(done_fd_.get(), &one, sizeof one);
}

DriverStarted DriverStart::take() {
  if (thread_.joinable()) thread_.join();
  return std::move(result_);
}

nlohmann::ordered_json node_identity(const NodeReport& node) {
  nlohmann::ordered_json j = to_json(node);
  if (auto devices = j.find("devices"); devices != j.end() && devices->is_array())
    for (auto& d : *devices)
      if (auto memory = d.find("memory"); memory != d.end() && memory->is_object()) memory->erase("free_bytes");
  return j;
}

}  // namespace cupool
