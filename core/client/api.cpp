// The parts of the C API that belong to no connection: versions, status names, strings, and the
// message of the last call made without a connection.
#include "client/api.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "cupool/client.h"

namespace cupool::client {

std::string& no_connection_error() {
  static thread_local std::string message;
  return message;
}

char* copy_string(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (!copy) throw std::bad_alloc();
  std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

}  // namespace cupool::client

extern "C" {

int cupool_abi_version(void) { return CUPOOL_CLIENT_ABI_VERSION; }

const char* cupool_status_name(int status) {
  switch (status) {
    case CUPOOL_OK: return "CUPOOL_OK";
    case CUPOOL_E_UNREACHABLE: return "CUPOOL_E_UNREACHABLE";
    case CUPOOL_E_REFUSED: return "CUPOOL_E_REFUSED";
    case CUPOOL_E_NOT_FOUND: return "CUPOOL_E_NOT_FOUND";
    case CUPOOL_E_QUOTA: return "CUPOOL_E_QUOTA";
    case CUPOOL_E_OUT_OF_MEMORY: return "CUPOOL_E_OUT_OF_MEMORY";
    case CUPOOL_E_INVALID: return "CUPOOL_E_INVALID";
    case CUPOOL_E_PROTOCOL: return "CUPOOL_E_PROTOCOL";
    case CUPOOL_E_CUDA: return "CUPOOL_E_CUDA";
    case CUPOOL_E_BUSY: return "CUPOOL_E_BUSY";
    case CUPOOL_E_EXISTS: return "CUPOOL_E_EXISTS";
    case CUPOOL_E_INTERNAL: return "CUPOOL_E_INTERNAL";
    default: return "CUPOOL_E_UNKNOWN";
  }
}

void cupool_free_string(char* text) { std::free(text); }

}  // extern "C"
