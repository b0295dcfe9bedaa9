// The requests a client library sends (docs/protocol.md): hello, list, import_pool, alloc, free,
// and for cached blocks reuse and dropped. Each parsed, checked against who sent it, and answered
// through the units that own what it touches.
#pragma once

#include "device/backend.h"
#include "holder/buffer_store.h"
#include "holder/client_table.h"
#include "holder/leasing.h"
#include "holder/pool_table.h"
#include "holder/reply.h"
#include "holder/request.h"
#include "model/model.h"

namespace cupool {

class ClientRequests {
 public:
  // `identity` (its pid) and `draining` are the holder's, read when a request comes.
  ClientRequests(Backend& backend, ClientTable& clients, PoolTable& pools, const BufferStore& buffers, Leasing& leasing,
                 const HolderLimits& limits, const model::HolderInfo& identity, const bool& draining)
      : backend_(backend),
        clients_(clients),
        pools_(pools),
        buffers_(buffers),
        leasing_(leasing),
        limits_(limits),
        identity_(identity),
        draining_(draining) {}

  Reply hello(Request& r);
  Reply list(Request& r);
  Reply import_pool(Request& r);
  // Waits (Reply::later()) when cached blocks are asked back to make room.
  Reply alloc(Request& r);
  Reply free(Request& r);
  Reply reuse(Request& r);
  Reply dropped(Request& r);

 private:
  Backend& backend_;
  ClientTable& clients_;
  PoolTable& pools_;
  const BufferStore& buffers_;
  Leasing& leasing_;
  const HolderLimits& limits_;
  const model::HolderInfo& identity_;
  const bool& draining_;
};

}  // namespace cupool
