-- kiln's kernel cache: one SQLite database (kiln.db) per cache directory.
-- Schema version 2 (version 1 had no row_signatures). You MUST bump kSchemaVersion in src/cache/schema.hpp, add a migration step
-- there, and update the golden test (tests/test_cache.cpp) whenever this file changes.
-- PRAGMA application_id identifies a kiln database; PRAGMA user_version holds the schema version.

CREATE TABLE IF NOT EXISTS kernels (
  id          INTEGER PRIMARY KEY,
  key         BLOB    NOT NULL UNIQUE CHECK (length(key) = 16),  -- XXH3-128 of the key material
  kernel      TEXT    NOT NULL,   -- registered kernel name
  operator    TEXT    NOT NULL,   -- "mha_prefill", ...
  signature   TEXT    NOT NULL,   -- canonical signature
  target      TEXT    NOT NULL,   -- exact compile target: "sm_90a", "gfx950:sramecc+:xnack-"
  backend     TEXT    NOT NULL,   -- "cuda" | "hip"
  compiler    TEXT    NOT NULL,   -- compiler identity: "nvrtc 13.0 <fingerprint>"
  options     TEXT    NOT NULL,   -- compiler options, space separated
  entry       TEXT    NOT NULL,   -- lowered name of the kernel entry in the binary
  binary      BLOB    NOT NULL,   -- CUBIN or code object
  size        INTEGER NOT NULL,   -- length(binary)
  checksum    INTEGER NOT NULL,   -- XXH3-64 of binary, as a signed 64-bit integer
  compile_ms  REAL    NOT NULL,
  created     INTEGER NOT NULL,   -- unix seconds
  last_used   INTEGER NOT NULL,   -- unix seconds; the LRU order of eviction
  hits        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS kernels_last_used ON kernels (last_used);
CREATE INDEX IF NOT EXISTS kernels_target ON kernels (target);

-- Values kiln derives once and remembers, e.g. the compiler identity of a given compiler
-- library file ("compiler-identity <path>|<size>|<mtime>|<inode>" -> "nvrtc 13.0 <fingerprint>"),
-- so a warm process need not load the compiler at all.
CREATE TABLE IF NOT EXISTS meta (
  name  TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

-- Signatures of rows, in bundles and seeds written by `kiln cache export --sign KEY`: Ed25519 by the
-- key whose public half is `signer`, over the row's fields and binary (src/cache/row_signing.cpp).
-- With KILN_CACHE_TRUSTED_KEYS set, import and seed lookups use only rows signed by those keys.
CREATE TABLE IF NOT EXISTS row_signatures (
  key        BLOB PRIMARY KEY CHECK (length(key) = 16),
  signer     BLOB NOT NULL CHECK (length(signer) = 32),
  signature  BLOB NOT NULL CHECK (length(signature) = 64)
);
