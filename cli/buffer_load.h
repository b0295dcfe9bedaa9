// cupool buffer load (cli/buffer_load.cpp), apart from the other buffer verbs (cli/buffer.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"

namespace cupool::cli {

struct LoadArgs {
  std::string socket;
  std::string name;
  std::string file;
  std::string pool;
  int device = -1;                 // -1: the pool's first device
  std::uint64_t part_size = 0;     // the largest allocation (0: tensors::kDefaultPartSize)
  unsigned read_threads = 0;       // 0: one per core, 2 to 16
  std::string direct_io = "auto";  // auto, always, never
  std::string gds = "auto";        // GPUDirect Storage: auto, always, never
};

// Reads the safetensors file `args.file` into a new buffer `args.name` and keeps its tensor index
// there; returns what was loaded (name, pool, device, size, tensors, seconds, ...). A bad file
// throws InputError before anything is made; a failure later removes the half-made buffer.
model::BufferMade load_buffer(const LoadArgs& args);
// "loaded buffer model: 203 tensors, 8.6 GiB from model.safetensors in 3.1 s (2.8 GiB/s), ..."
std::string render_loaded(const model::BufferMade& loaded);

// `buffer load NAME FILE FILE...`: `base` (its name, pool and options) split into one load per
// file: file k into buffer NAME-k on the k-th of `devices`, or on device k when `devices` is
// empty; any other count of devices throws InputError naming what is valid. Each load reads with
// base.read_threads threads when it is set (--read-threads), else with its share of the default,
// max(2, default_load_threads(cores) / files) (device/file_load.h; `cores` as
// std::thread::hardware_concurrency() says), so that the loads together read with about as
// many threads as one load alone. The names are not checked here.
std::vector<LoadArgs> split_load(const LoadArgs& base, const std::vector<std::string>& files,
                                 const std::vector<int>& devices, unsigned cores);

// Loads every one of `loads` (two or more, from split_load) at once, all or nothing: every file's
// header is read and checked first, and a name in use is refused, before any buffer is made; then
// one thread per file, each with its own connection, creates its buffer and reads its file into
// it, with one progress line for them all on a terminal. When any load fails, the others stop
// and every buffer made here is removed; the error names the file and device that failed.
model::BuffersLoaded load_buffers(const std::vector<LoadArgs>& loads);
// One render_loaded per buffer and "3 buffers, 25.3 GiB in 2.1 s (12.0 GB/s together)".
std::string render_loaded(const model::BuffersLoaded& loaded);

}  // namespace cupool::cli
