"""Layer 0 helpers: hashing, atomic writes, fingerprints, progress."""
