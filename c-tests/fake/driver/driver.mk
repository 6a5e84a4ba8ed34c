# Placeholder: the fake driver's rules (target $(FAKE)/libcuda.so.1).
fake:
