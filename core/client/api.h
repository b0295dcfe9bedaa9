// What the files of the client library share: the message of this thread's last call that had no
// connection (cupool_last_error(NULL)), and strings handed to the caller.
#pragma once

#include <string>

namespace cupool::client {

// The message of this thread's last failed cupool_connect, cupool_configure or cupool_stats.
std::string& no_connection_error();

// A malloc'ed copy of `text`, for the caller to free with cupool_free_string. Throws bad_alloc.
char* copy_string(const std::string& text);

}  // namespace cupool::client
