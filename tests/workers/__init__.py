"""signaling/workers: --workers N behind one port."""
