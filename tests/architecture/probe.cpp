// A probe of the direction rule (direction_test.py): built against one part, it includes one
// header of another part, named by PROBE_HEADER. It compiles only when the part uses the other.
#include PROBE_HEADER

int cupool_direction_probe() { return 0; }
