/* RTLD_NEXT probe, library B: the definition A's RTLD_NEXT lookup must find. */
const char *probe(void) { return "B"; }
