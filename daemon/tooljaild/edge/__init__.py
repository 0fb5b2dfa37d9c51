"""The gRPC edge: the servicer, error mapping, drain, authentication and transport."""
