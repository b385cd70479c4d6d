"""CPU harness for the custom Metal kernel bodies in metal/ (see runner.py, metal_shim.h)."""
