"""Who is calling and what they may do: tokens, TLS identities, per-identity policy.

`settings` holds the `[auth]` and `[tls]` tables; `policy` reads the tokens file
into `Identity` objects (each with its SHA-256 token hash and its policy). The
server authenticates each request to one `Identity` (or to none, when no tokens
file is configured: then the socket's permissions are the boundary).
"""
