// cupool buffer load: a safetensors file read into a new named buffer, its tensor index kept with
// the buffer in the holder, so every process on the node maps the weights instead of reading them.
#include "cli/buffer_load.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <utility>

#include "base/fd.h"
#include "base/units.h"
#include "cli/holder_client.h"
#include "cli/verbs.h"
#include "cupool/client.h"
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

model::BufferMade load_buffer(const LoadArgs& args) {
  if (args.gds != "never") (void)place_cufile_log();  // cuFile may be opened
  const auto started = Clock::now();
  model::LoadStages stages;
  // One open for the header and the data: a path opened twice may name two files (issue 22: a
  // user who could write the directory swapped in a link to a root-only file between the opens).
  const Fd file = tensors::open_file(args.file);
  const tensors::FileHeader header = tensors::read_header(file.get(), args.file);
  const tensors::Index placed =
      tensors::layout(header.index, args.part_size ? args.part_size : tensors::kDefaultPartSize);
  const std::uint64_t size = tensors::total_size(placed);
  stages.index_seconds = seconds_since(started);
  const json create = proto::to_json(proto::BufferCreate{args.name, args.pool, args.device, size, /*loading=*/true,
                                                         tensors::tensors_json(placed), tensors::metadata_json(placed),
                                                         json(placed.parts)});
  const std::size_t request_bytes = create.dump().size();
  if (request_bytes > proto::kMaxRequest)
    throw InputError(args.file + ": its index of " + std::to_string(placed.tensors.size()) + " tensors is " +
                     format_bytes(request_bytes) + " as JSON; a holder takes at most " +
                     format_bytes(proto::kMaxRequest) + " in one request");

  auto at = Clock::now();
  HolderClient holder = HolderClient::connect(args.socket, "cupool buffer load");
  const json created = holder.request(create);
  stages.create_seconds = seconds_since(at);
  const cupool_load_options how{args.read_threads, direct_io_of(args.direct_io)};
  std::uint32_t threads = 0;
  std::string method = "staged", gds_note;  // the first part's (every part is read the same way)
  bool direct = false;
  double cached_pages = 0;  // the parts' page-cache ratios, weighted by their bytes
  // From here the buffer exists, loading: on any failure it is removed, and were this process
  // killed, the holder would remove it when the connection drops.
  cupool_lease* lease = nullptr;
  try {
    ::posix_fadvise(file.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    // Each placed tensor's bytes, from where the file has them (names are unique: read_header).
    std::map<std::string, std::uint64_t> in_file;
    for (const tensors::Tensor& t : header.index.tensors) in_file[t.name] = t.offset;
    std::vector<std::vector<cupool_file_range>> ranges(placed.parts.size());
    for (const tensors::Tensor& t : placed.tensors)
      ranges[t.part].push_back({header.data_start + in_file.at(t.name), t.offset, t.size});
    std::uint64_t total = 0, before = 0;
    for (const auto& t : placed.tensors) total += t.size;
    ProgressLine progress(args.name);
    at = Clock::now();
    for (std::uint32_t part = 0; part < ranges.size(); ++part) {
      lease = holder.open_buffer(args.name, part);
      cupool_load_path path{};
      const cupool_load_report done =
          holder.load_file(lease, file.get(), ranges[part], how, gds_of(args.gds), &path,
                           [&](std::uint64_t now, std::uint64_t) { progress(before + now, total); });
      for (const auto& r : ranges[part]) before += r.bytes;
      holder.release(std::exchange(lease, nullptr));
      stages.read_seconds += done.read_seconds;
      stages.copy_wait_seconds += done.copy_wait_seconds;
      threads = std::max(threads, done.threads);
      direct = direct || done.direct_io != 0;
      cached_pages += done.resident_fraction * static_cast<double>(done.bytes);
      if (part == 0) {
        method = read_method_name(path.read_method);
        gds_note.assign(path.gds_note, strnlen(path.gds_note, sizeof path.gds_note));
      }
    }
    stages.load_seconds = seconds_since(at);
    at = Clock::now();
    holder.request(proto::to_json(proto::BufferReady{args.name}));
    stages.ready_seconds = seconds_since(at);
  } catch (...) {
    if (lease) holder.release(lease);
    try {
      holder.request_raw(proto::to_json(proto::BufferRemove{args.name, /*force=*/true}));
    } catch (...) {
      // The connection is gone: the holder removes a buffer whose loader left.
    }
    throw;
  }
  const double seconds = seconds_since(started);
  std::uint64_t bytes = 0;
  for (const auto& t : placed.tensors) bytes += t.size;
  model::BufferMade out;
  out.name = args.name;
  // Where the holder put it (its reply to buffer_create: the buffer's pool and device).
  model::BufferMade where;
  where.pool = args.pool;
  where.id.device = args.device;
  model::read_json(created, where);
  out.pool = where.pool;
  out.id = where.id;
  out.size_bytes = size;
  out.part_count = placed.parts.size();
  out.tensor_count = placed.tensors.size();
  out.file = args.file;
  out.tensor_bytes = bytes;
  out.elapsed_seconds = seconds;
  out.bytes_per_second = seconds > 0 ? static_cast<std::uint64_t>(static_cast<double>(bytes) / seconds) : 0;
  out.stages = stages;
  out.read_thread_count = threads;
  out.direct_io = direct;
  out.page_cache_ratio = bytes ? std::clamp(cached_pages / static_cast<double>(bytes), 0.0, 1.0) : 1.0;
  out.read_method = method;
  out.gds = model::LoadGds{gds_note.empty() ? std::nullopt : std::optional<std::string>(gds_note)};
  return out;
}

namespace {

// "  time: index 0.01 s, create 0.21 s, load 1.52 s (reads 1.47 s, waits for copies 0.01 s, 8
// threads, O_DIRECT), ready 0.00 s": which stage bounds the load.
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
         sec(st.load_seconds) + " (reads " + sec(st.read_seconds) + ", waits for copies " + sec(st.copy_wait_seconds) +
         ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") +
         (r.direct_io.value_or(false) ? ", O_DIRECT" : "") + via(r.read_method.value_or("staged")) + "), ready " +
         sec(st.ready_seconds) + "\n";
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

}  // namespace cupool::cli
