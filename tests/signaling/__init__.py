"""signaling/: routes, auth, CORS, limits, drain, slow clients, TLS, the server CLI."""
