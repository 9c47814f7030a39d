"""The peer's transports: one module per protocol, each a `PeerCall` (contract: base.py)."""
