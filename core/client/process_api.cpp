// The C API's calls in this process, with no holder involved: cupool_configure applies a config's
// process: section (core/process), cupool_stats reports this process's pools.
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/error.h"
#include "client/api.h"
#include "config/config.h"
#include "config/diagnostics.h"
#include "cupool/client.h"
#include "device/backend.h"
#include "device/node.h"
#include "device/sim_backend.h"
#include "process/process.h"

using Json = nlohmann::ordered_json;

namespace {

// The process's own backend for cupool_configure and cupool_stats, made once and never destroyed:
// an application's exit must not race a destructor that talks to the driver.
std::mutex g_process_mutex;
cupool::Backend* g_process_backend = nullptr;
// The release thresholds cupool_configure set, as the file wrote them (cupool_stats reports 75% as 75%).
std::map<cupool::PoolHandle, cupool::ReleaseThreshold>* g_thresholds = nullptr;

cupool::Backend& process_backend() {
  if (!g_process_backend) {
    const char* profile = std::getenv("CUPOOL_PROFILE");
    std::unique_ptr<cupool::Backend> b;
    if (profile && *profile)
      b = std::make_unique<cupool::SimBackend>(cupool::load_profile(profile));
    else
      b = cupool::make_cuda_backend();
    b->init();
    g_process_backend = b.release();
  }
  return *g_process_backend;
}

// Runs `body` for the process-level calls: failures become a status and cupool::client::no_connection_error().
template <class F>
int process_guarded(F&& body) {
  std::lock_guard<std::mutex> lock(g_process_mutex);
  cupool::client::no_connection_error().clear();
  try {
    body();
    return CUPOOL_OK;
  } catch (const cupool::ConfigRejected& e) {
    cupool::client::no_connection_error() = e.rendered() + e.what();
    return e.c_status();
  } catch (const cupool::Error& e) {
    cupool::client::no_connection_error() = e.what();
    return e.c_status();
  } catch (const std::exception& e) {
    cupool::client::no_connection_error() = e.what();
    return CUPOOL_E_INTERNAL;
  }
}

}  // namespace

extern "C" {

int cupool_configure(const char* path, char** report) {
  if (report) *report = nullptr;
  return process_guarded([&] {
    if (!path || !*path) throw cupool::InputError("cupool_configure: no config file given");
    const cupool::SourceFile file = cupool::SourceFile::read_regular(path, cupool::kMaxConfigBytes);
    const cupool::ConfigureResult r = cupool::configure_process(process_backend(), file.text(), file.path());
    if (!g_thresholds) g_thresholds = new std::map<cupool::PoolHandle, cupool::ReleaseThreshold>();  // never freed
    for (const auto& [pool, threshold] : r.thresholds) (*g_thresholds)[pool] = threshold;
    if (report) *report = cupool::client::copy_string(r.to_json().dump(-1, ' ', false, Json::error_handler_t::replace));
  });
}

int cupool_stats(char** json) {
  if (json) *json = nullptr;
  return process_guarded([&] {
    if (!json) throw cupool::InputError("cupool_stats: json must not be NULL");
    const std::map<cupool::PoolHandle, cupool::ReleaseThreshold> kNone;
    *json = cupool::client::copy_string(cupool::process_stats(process_backend(), g_thresholds ? *g_thresholds : kNone)
                                            .dump(-1, ' ', false, Json::error_handler_t::replace));
  });
}

}  // extern "C"
