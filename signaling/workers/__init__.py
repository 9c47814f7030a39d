"""Several worker processes behind one port: the supervisor, the private channel between
workers, routing, hand-over, shared loads and limits."""
