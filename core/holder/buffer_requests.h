// The requests on held buffers (docs/protocol.md): a client opens, closes and reads the index of
// one; an admin creates one (`cupool buffer create`, `cupool buffer load`), says it is loaded, or
// removes it.
#pragma once

#include "device/backend.h"
#include "holder/buffer_store.h"
#include "holder/client_table.h"
#include "holder/pool_table.h"
#include "holder/reply.h"
#include "holder/request.h"

namespace cupool {

class BufferRequests {
 public:
  // `draining` is the holder's, read when a request comes.
  BufferRequests(Backend& backend, ClientTable& clients, PoolTable& pools, BufferStore& buffers,
                 const HolderLimits& limits, const bool& draining)
      : backend_(backend), clients_(clients), pools_(pools), buffers_(buffers), limits_(limits), draining_(draining) {}

  Reply open(Request& r);
  Reply close(Request& r);
  Reply tensors(Request& r);
  Reply create(Request& r);
  Reply ready(Request& r);
  Reply remove(Request& r);

 private:
  Backend& backend_;
  ClientTable& clients_;
  PoolTable& pools_;
  BufferStore& buffers_;
  const HolderLimits& limits_;
  const bool& draining_;
};

}  // namespace cupool
