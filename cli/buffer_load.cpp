// cupool buffer load: a safetensors file read into a new named buffer, its tensor index kept with
// the buffer in the holder, so every process on the node maps the weights instead of reading them.
#include "cli/buffer_load.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/fd.h"
#include "base/units.h"
#include "cli/holder_client.h"
#include "cli/verbs.h"
#include "cupool/client.h"
#include "device/file_load.h"
#include "model/fields.h"
#include "model/model.h"
#include "protocol/messages.h"
#include "protocol/protocol.h"
#include "tensors/safetensors.h"

namespace cupool::cli {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// "loading model [########------------]  3.1 GiB of 8.6 GiB  36%  5.21 GB/s" on one terminal
// line, at most ten times a second; nothing when stderr is not a terminal. GB/s (10^9), as disks
// and buses are rated.
class ProgressLine {
 public:
  explicit ProgressLine(std::string name) : name_(std::move(name)), shown_(::isatty(2) == 1) {}
  void operator()(std::uint64_t done, std::uint64_t total) {
    if (!shown_) return;
    const auto now = Clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double s = std::max(seconds_since(start_), 1e-3);
    constexpr int kWidth = 24;
    const int filled =
        total ? static_cast<int>(static_cast<double>(done) * kWidth / static_cast<double>(total)) : kWidth;
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.2f GB/s", static_cast<double>(done) / s / 1e9);
    std::cerr << "\r\033[Kloading " << name_ << " [" << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(kWidth - filled), '-') << "]  " << format_bytes(done) << " of "
              << format_bytes(total) << "  " << (total ? done * 100 / total : 100) << "%  " << rate << std::flush;
    drawn_ = true;
  }
  ~ProgressLine() {
    if (drawn_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  std::string name_;
  bool shown_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
};

cupool_gds gds_of(const std::string& how) {
  if (how == "always") return CUPOOL_GDS_ALWAYS;
  if (how == "never") return CUPOOL_GDS_NEVER;
  return CUPOOL_GDS_AUTO;
}

const char* read_method_name(std::int32_t method) {
  switch (method) {
    case CUPOOL_READ_GPUDIRECT: return "gpudirect";
    case CUPOOL_READ_GPUDIRECT_COMPATIBILITY: return "gpudirect_compatibility";
    default: return "staged";
  }
}

cupool_direct_io direct_io_of(const std::string& how) {
  if (how == "always") return CUPOOL_DIRECT_IO_ALWAYS;
  if (how == "never") return CUPOOL_DIRECT_IO_NEVER;
  return CUPOOL_DIRECT_IO_AUTO;
}

}  // namespace

namespace {

// A load's progress callback throws this once another load of the same command failed: the read
// threads stop (core/device/file_load.cpp's Crew stops on a progress that throws) and the load
// fails, its buffer to be removed with the others.
struct Stopped : std::runtime_error {
  Stopped() : std::runtime_error("stopped: another load of this command failed") {}
};

// One file's load into one new buffer, in its steps: the file's header read and checked (the
// constructor: nothing is made), the buffer made (create), the file read into it (fill), the
// buffer ready for others (ready), and what was done (made).
class OneLoad {
 public:
  // One open for the header and the data: a path opened twice may name two files (issue 22: a
  // user who could write the directory swapped in a link to a root-only file between the opens).
  explicit OneLoad(LoadArgs args)
      : args_(std::move(args)),
        started_(Clock::now()),
        file_(tensors::open_file(args_.file)),
        header_(tensors::read_header(file_.get(), args_.file)),
        placed_(tensors::layout(header_.index, args_.part_size ? args_.part_size : tensors::kDefaultPartSize)),
        size_(tensors::total_size(placed_)) {
    for (const auto& t : placed_.tensors) bytes_ += t.size;
    stages_.index_seconds = seconds_since(started_);
    create_ = proto::to_json(proto::BufferCreate{args_.name, args_.pool, args_.device, size_, /*loading=*/true,
                                                 tensors::tensors_json(placed_), tensors::metadata_json(placed_),
                                                 json(placed_.parts)});
    const std::size_t request_bytes = create_.dump().size();
    if (request_bytes > proto::kMaxRequest)
      throw InputError(args_.file + ": its index of " + std::to_string(placed_.tensors.size()) + " tensors is " +
                       format_bytes(request_bytes) + " as JSON; a holder takes at most " +
                       format_bytes(proto::kMaxRequest) + " in one request");
  }

  const LoadArgs& args() const { return args_; }
  std::uint64_t tensor_bytes() const { return bytes_; }

  // Connects and has the holder make the buffer, loading: from here it exists, and it goes when
  // the connection returned (the holder removes a buffer whose loader left before it was ready).
  HolderClient create() {
    const auto at = Clock::now();
    HolderClient holder = HolderClient::connect(args_.socket, "cupool buffer load");
    created_ = holder.request(create_);
    stages_.create_seconds = seconds_since(at);
    return holder;
  }

  // Reads the file into the buffer, part by part; `progress` is told the bytes copied so far, and
  // may throw to stop the load.
  void fill(HolderClient& holder, const std::function<void(std::uint64_t)>& progress) {
    const cupool_load_options how{args_.read_threads, direct_io_of(args_.direct_io)};
    ::posix_fadvise(file_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    // Each placed tensor's bytes, from where the file has them (names are unique: read_header).
    std::map<std::string, std::uint64_t> in_file;
    for (const tensors::Tensor& t : header_.index.tensors) in_file[t.name] = t.offset;
    std::vector<std::vector<cupool_file_range>> ranges(placed_.parts.size());
    for (const tensors::Tensor& t : placed_.tensors)
      ranges[t.part].push_back({header_.data_start + in_file.at(t.name), t.offset, t.size});
    std::uint64_t before = 0;
    const auto at = Clock::now();
    cupool_lease* lease = nullptr;
    try {
      for (std::uint32_t part = 0; part < ranges.size(); ++part) {
        const auto opened = Clock::now();
        lease = holder.open_buffer(args_.name, part);
        stages_.open_seconds += seconds_since(opened);
        cupool_load_path path{};
        const cupool_load_report done =
            holder.load_file(lease, file_.get(), ranges[part], how, gds_of(args_.gds), &path,
                             [&](std::uint64_t now, std::uint64_t) { progress(before + now); });
        for (const auto& r : ranges[part]) before += r.bytes;
        holder.release(std::exchange(lease, nullptr));
        stages_.copy_seconds += done.seconds;
        stages_.read_seconds += done.read_seconds;
        stages_.copy_wait_seconds += done.copy_wait_seconds;
        threads_ = std::max(threads_, done.threads);
        direct_ = direct_ || done.direct_io != 0;
        cached_pages_ += done.resident_fraction * static_cast<double>(done.bytes);
        if (part == 0) {  // every part is read the same way
          method_ = read_method_name(path.read_method);
          gds_note_.assign(path.gds_note, strnlen(path.gds_note, sizeof path.gds_note));
        }
      }
    } catch (...) {
      if (lease) holder.release(lease);
      throw;
    }
    stages_.load_seconds = seconds_since(at);
  }

  // Tells the holder the buffer is complete: others may open it.
  void ready(HolderClient& holder) {
    const auto at = Clock::now();
    holder.request(proto::to_json(proto::BufferReady{args_.name}));
    stages_.ready_seconds = seconds_since(at);
  }

  model::BufferMade made() const {
    const double seconds = seconds_since(started_);
    model::BufferMade out;
    out.name = args_.name;
    // Where the holder put it (its reply to buffer_create: the buffer's pool and device).
    model::BufferMade where;
    where.pool = args_.pool;
    where.id.device = args_.device;
    model::read_json(created_, where);
    out.pool = where.pool;
    out.id = where.id;
    out.size_bytes = size_;
    out.part_count = placed_.parts.size();
    out.tensor_count = placed_.tensors.size();
    out.file = args_.file;
    out.tensor_bytes = bytes_;
    out.elapsed_seconds = seconds;
    out.bytes_per_second = seconds > 0 ? static_cast<std::uint64_t>(static_cast<double>(bytes_) / seconds) : 0;
    out.stages = stages_;
    out.read_thread_count = threads_;
    out.direct_io = direct_;
    out.page_cache_ratio = bytes_ ? std::clamp(cached_pages_ / static_cast<double>(bytes_), 0.0, 1.0) : 1.0;
    out.read_method = method_;
    out.gds = model::LoadGds{gds_note_.empty() ? std::nullopt : std::optional<std::string>(gds_note_)};
    return out;
  }

 private:
  LoadArgs args_;
  Clock::time_point started_;
  Fd file_;
  tensors::FileHeader header_;
  tensors::Index placed_;
  std::uint64_t size_ = 0;   // the buffer's bytes, every tensor 256-byte aligned
  std::uint64_t bytes_ = 0;  // the tensors' bytes
  json create_;              // the buffer_create request
  json created_;             // the holder's reply to it
  model::LoadStages stages_;
  std::uint32_t threads_ = 0;
  std::string method_ = "staged", gds_note_;  // the first part's
  bool direct_ = false;
  double cached_pages_ = 0;  // the parts' page-cache ratios, weighted by their bytes
};

// Removes a buffer this command made; never throws (a connection that is gone took it along).
void remove_made(HolderClient& holder, const std::string& name) noexcept {
  try {
    holder.request_raw(proto::to_json(proto::BufferRemove{name, /*force=*/true}));
  } catch (...) {
    // The connection is gone: the holder removes a buffer whose loader left.
  }
}

}  // namespace

model::BufferMade load_buffer(const LoadArgs& args) {
  if (args.gds != "never") (void)place_cufile_log();  // cuFile may be opened
  OneLoad load(args);
  HolderClient holder = load.create();
  // From here the buffer exists, loading: on any failure it is removed, and were this process
  // killed, the holder would remove it when the connection drops.
  try {
    ProgressLine progress(args.name);
    load.fill(holder, [&](std::uint64_t done) { progress(done, load.tensor_bytes()); });
    load.ready(holder);
  } catch (...) {
    remove_made(holder, args.name);
    throw;
  }
  return load.made();
}

std::vector<LoadArgs> split_load(const LoadArgs& base, const std::vector<std::string>& files,
                                 const std::vector<int>& devices, unsigned cores) {
  const std::size_t n = files.size();
  if (!devices.empty() && devices.size() != n)
    throw InputError("--device: " + std::to_string(n) + " files take " + std::to_string(n) +
                     " --device options (file k to the k-th) or none (file k to device k), not " +
                     std::to_string(devices.size()));
  const auto share =
      static_cast<unsigned>(std::max<std::size_t>(2, default_load_threads(cores) / std::max<std::size_t>(n, 1)));
  std::vector<LoadArgs> loads;
  for (std::size_t k = 0; k < n; ++k) {
    LoadArgs one = base;
    one.name = base.name + "-" + std::to_string(k);
    one.file = files[k];
    one.device = devices.empty() ? static_cast<int>(k) : devices[k];
    one.read_threads = base.read_threads ? base.read_threads : share;
    loads.push_back(std::move(one));
  }
  return loads;
}

namespace {

// Rethrows `failure`, its message led by which load it was ("b.safetensors to device 1 (buffer
// llama-1): ..."), the exit code kept.
[[noreturn]] void throw_naming(const std::exception_ptr& failure, const LoadArgs& load, const std::string& after) {
  const std::string which = load.file + " to device " + std::to_string(load.device) + " (buffer " + load.name + ")";
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    throw Error(e.code(), which + ": " + e.what() + after, e.origin());
  } catch (const std::exception& e) {
    throw Error(Errc::internal, which + ": " + e.what() + after);
  }
}

// Runs body(k) for k in [0, n) on a thread each and waits for them all; failures[k] is what body(k)
// threw. The first failure (in time) is `first`; each later one may be a consequence of it.
struct Round {
  std::vector<std::exception_ptr> failures;
  std::atomic<int> first{-1};
  std::atomic<bool> failed{false};

  explicit Round(std::size_t n) : failures(n) {}

  void run(std::size_t n, const std::function<void(std::size_t)>& body,
           const std::function<void()>& while_waiting = nullptr) {
    std::mutex mutex;
    std::condition_variable changed;
    std::size_t finished = 0;
    std::vector<std::thread> threads;
    auto fail = [&](std::size_t k) {
      failures[k] = std::current_exception();
      int none = -1;
      if (!failed.load()) first.compare_exchange_strong(none, static_cast<int>(k));
      failed = true;
    };
    auto over = [&] {
      std::lock_guard<std::mutex> lock(mutex);
      ++finished;
      changed.notify_all();
    };
    for (std::size_t k = 0; k < n; ++k) {
      try {
        threads.emplace_back([&, k] {
          try {
            body(k);
          } catch (...) {
            fail(k);
          }
          over();
        });
      } catch (...) {  // no thread for it (the host is out of threads): the others stop
        fail(k);
        over();
      }
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      while (finished < n) {
        changed.wait_for(lock, std::chrono::milliseconds(100));
        if (while_waiting && finished < n) {
          lock.unlock();
          while_waiting();
          lock.lock();
        }
      }
    }
    for (std::thread& t : threads) t.join();
  }

  // Rethrows the first failure, naming its load (loads[k] for body(k)).
  [[noreturn]] void throw_first(const std::vector<LoadArgs>& loads, const std::string& after) const {
    const auto k = static_cast<std::size_t>(first.load());
    throw_naming(failures[k], loads[k], after);
  }
};

// Refuses, before anything is made, names that a buffer of the holder already has.
void refuse_names_in_use(const std::vector<LoadArgs>& loads) {
  HolderClient holder = HolderClient::connect(loads.front().socket, "cupool buffer load");
  model::Status status;
  model::Seen seen;
  model::read_json_lenient(holder.request(proto::to_json(proto::Status{})), status, seen);
  for (const LoadArgs& load : loads)
    for (const model::BufferInfo& b : status.buffers)
      if (b.name == load.name)
        throw Error(Errc::exists, "a buffer named " + load.name + " exists (for " + load.file +
                                      "); nothing was loaded ('cupool buffer rm " + load.name +
                                      "' removes it, or choose another NAME)");
}

}  // namespace

model::BuffersLoaded load_buffers(const std::vector<LoadArgs>& loads) {
  const auto started = Clock::now();
  const std::size_t n = loads.size();
  for (const LoadArgs& load : loads)
    if (load.gds != "never") (void)place_cufile_log();  // cuFile may be opened
  // Every header read and checked first: a bad file makes nothing.
  std::vector<std::unique_ptr<OneLoad>> each;
  std::uint64_t total = 0;
  for (const LoadArgs& load : loads) {
    each.push_back(std::make_unique<OneLoad>(load));
    total += each.back()->tensor_bytes();
  }
  refuse_names_in_use(loads);

  // The buffers made, each on its own connection (the holder removes a loading buffer whose
  // connection drops: a killed command leaves none).
  std::vector<std::optional<HolderClient>> holders(n);
  auto remove_all = [&]() noexcept {
    for (std::size_t k = 0; k < n; ++k)
      if (holders[k]) remove_made(*holders[k], loads[k].name);
  };
  const std::string undone = " (every buffer of this command was removed)";
  Round create(n);
  create.run(n, [&](std::size_t k) { holders[k] = each[k]->create(); });
  if (create.failed) {
    remove_all();
    create.throw_first(loads, undone);
  }

  // The loads at once; the first to fail stops the others.
  std::unique_ptr<std::atomic<std::uint64_t>[]> done(new std::atomic<std::uint64_t>[n]);
  for (std::size_t k = 0; k < n; ++k) done[k] = 0;
  Round fill(n);
  {
    ProgressLine progress(loads.front().name + " to " + loads.back().name);
    fill.run(
        n,
        [&](std::size_t k) {
          each[k]->fill(*holders[k], [&, k](std::uint64_t bytes) {
            done[k] = bytes;
            if (fill.failed) throw Stopped();
          });
        },
        [&] {
          std::uint64_t sum = 0;
          for (std::size_t k = 0; k < n; ++k) sum += done[k];
          progress(sum, total);
        });
  }
  if (fill.failed) {
    remove_all();
    fill.throw_first(loads, undone);
  }
  // Ready only once every buffer is complete: nobody opens one of a set that is then removed.
  for (std::size_t k = 0; k < n; ++k) {
    try {
      each[k]->ready(*holders[k]);
    } catch (...) {
      remove_all();
      throw_naming(std::current_exception(), loads[k], undone);
    }
  }

  model::BuffersLoaded out;
  for (const auto& load : each) out.buffers.push_back(load->made());
  out.tensor_bytes = total;
  out.elapsed_seconds = seconds_since(started);
  out.bytes_per_second =
      out.elapsed_seconds > 0 ? static_cast<std::uint64_t>(static_cast<double>(total) / out.elapsed_seconds) : 0;
  return out;
}

namespace {

// "  time: index 0.01 s, create 0.21 s, load 1.52 s (opening 0.20 s, copying 1.31 s: reads 1.27 s, waits for copies
// 0.01 s, 8 threads, O_DIRECT), ready 0.00 s": which stage bounds the load.
std::string render_stages(const model::BufferMade& r) {
  if (!r.stages) return "";
  const model::LoadStages& st = *r.stages;
  auto sec = [](double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f s", seconds);
    return std::string(text);
  };
  const std::uint64_t threads = r.read_thread_count.value_or(0);
  auto via = [](const std::string& method) -> std::string {
    if (method == "gpudirect") return ", GPUDirect Storage";
    if (method == "gpudirect_compatibility") return ", cuFile in compatibility mode";
    return "";
  };
  return "  time: index " + sec(st.index_seconds) + ", create " + sec(st.create_seconds) + ", load " +
         sec(st.load_seconds) + " (opening " + sec(st.open_seconds) + ", copying " + sec(st.copy_seconds) + ": reads " +
         sec(st.read_seconds) + ", waits for copies " + sec(st.copy_wait_seconds) + ", " + std::to_string(threads) +
         (threads == 1 ? " thread" : " threads") + (r.direct_io.value_or(false) ? ", O_DIRECT" : "") +
         via(r.read_method.value_or("staged")) + "), ready " + sec(st.ready_seconds) + "\n";
}

}  // namespace

std::string render_loaded(const model::BufferMade& r) {
  const std::uint64_t count = r.tensor_count.value_or(0);
  const std::uint64_t parts = r.part_count.value_or(1);
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f s", r.elapsed_seconds.value_or(0.0));
  return "loaded buffer " + r.name + ": " + std::to_string(count) + (count == 1 ? " tensor, " : " tensors, ") +
         format_bytes(r.tensor_bytes.value_or(0)) + " from " + r.file.value_or("") + " in " + rate + " (" +
         format_bytes(r.bytes_per_second.value_or(0)) + "/s), pool " + r.pool + " on device " +
         std::to_string(r.id.device) + (parts > 1 ? ", in " + std::to_string(parts) + " parts" : std::string()) + "\n" +
         render_stages(r);
}

std::string render_loaded(const model::BuffersLoaded& loaded) {
  std::string text;
  for (const model::BufferMade& b : loaded.buffers) text += render_loaded(b);
  char tail[96];
  std::snprintf(tail, sizeof tail, " in %.1f s (%.1f GB/s together)\n", loaded.elapsed_seconds,
                static_cast<double>(loaded.bytes_per_second) / 1e9);
  return text + std::to_string(loaded.buffers.size()) + " buffers, " + format_bytes(loaded.tensor_bytes) + tail;
}

}  // namespace cupool::cli
