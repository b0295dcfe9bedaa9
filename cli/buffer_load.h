// cupool buffer load (cli/buffer_load.cpp), apart from the other buffer verbs (cli/buffer.cpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace cupool::cli
