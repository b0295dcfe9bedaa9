// `cupool query`'s table: the node report for people (the JSON is the model's NodeFacts).
#pragma once

#include <string>

#include "device/node.h"

namespace cupool {

// The human-readable report.
std::string render_report_table(const NodeReport& report);

}  // namespace cupool
