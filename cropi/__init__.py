"""cropi: offline influence scoring (POPI) and the CROPI curriculum selector for RLVR."""

__version__ = "0.1.0"
