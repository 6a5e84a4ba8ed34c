/* RTLD_NEXT probe, library B: the definitions A's RTLD_NEXT lookups must find. */
#include "probe_names.h"
const char *probe(void) { return "B"; }
#define DEFINE_B(n) const char *n(void) { return "B"; }
PROBE_NAMES(DEFINE_B)
