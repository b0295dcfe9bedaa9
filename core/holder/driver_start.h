// The part of the holder's start that needs the driver, on a thread of its own while the serving
// thread already answers from custody (Holder::starting): the driver loaded and initialised, the
// node asked (when the start checked its config against the report custody kept), the adopted
// buffers mapped (the driver checks each is what the manifest says: verify_adopted), and the
// config's devices opened (their primary contexts). Only the backend is touched on that thread;
// the serving thread makes no driver call until take() has joined it.
#pragma once

#include <atomic>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "device/backend.h"
#include "device/node.h"
#include "holder/buffer_store.h"

namespace cupool {

struct DriverStarted {
  std::optional<NodeReport> node;    // the driver's report (none when the start asked it already)
  std::vector<AdoptedCheck> checks;  // one per adopted part
  double init_ms = 0;                // loading the driver and cuInit
  double node_ms = 0;                // the node report
  double adopt_ms = 0;               // mapping the adopted buffers
  double devices_ms = 0;             // opening the devices no adopted buffer opened
  std::exception_ptr failure;        // what failed (NoDriverError, CudaError, ...), then nothing else ran
};

class DriverStart {
 public:
  // Starts the thread. `ask_node`: build the node report; `parts`: verify_adopted's; `devices`: the
  // ordinals to open (the config's pools').
  DriverStart(Backend& backend, bool ask_node, std::vector<AdoptedPart> parts, std::vector<int> devices);
  ~DriverStart();  // joins (the driver can't be interrupted: a stuck cuInit holds the exit up)
  DriverStart(const DriverStart&) = delete;
  DriverStart& operator=(const DriverStart&) = delete;

  // Readable once the thread is done (an eventfd, for the serving loop's poll).
  int fd() const { return done_fd_.get(); }
  bool done() const { return done_.load(); }
  // Joins and returns what the thread found; call once, after done().
  DriverStarted take();

 private:
  void run(Backend& backend, bool ask_node, const std::vector<AdoptedPart>& parts, const std::vector<int>& devices);

  Fd done_fd_;
  std::atomic<bool> done_{false};
  DriverStarted result_;
  std::thread thread_;
};

// A node report without what changes from one moment to the next (free memory): two reports of one
// node and driver are equal in this form.
nlohmann::ordered_json node_identity(const NodeReport& node);

}  // namespace cupool
