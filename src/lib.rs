//! librankguard.so placeholder
