// cupool_configure's report declared once (docs/naming.md): its writer comes from this
// declaration, and tests/unit/model holds the names against schemas/cupool-configure-v1.schema.json.
#pragma once

#include "model/fields.h"
#include "process/process.h"

namespace cupool {

CUPOOL_FIELDS(ProcessChange) {
  f.flat(v.id);
  f("field", v.field);
  f("from", v.from);
  f("to", v.to);
  // Written until cupool 0.2 (docs/naming.md, "Old names"): the process's ordinal under its old name.
  f.computed("device", v.id.process_device);
}
CUPOOL_FIELDS(ConfigureResult) {
  f("devices", v.devices);
  f("changes", v.changes);
  f("findings", v.findings);
  f("warnings_rendered", v.warnings_rendered);
  // Written until cupool 0.2: the rendered text under its old name (plan's `warnings` is the findings).
  f.computed("warnings", v.warnings_rendered);
}

}  // namespace cupool
