-- The case database: evidence manifest, ingested records, quarantine and duplicates.
-- Every record read lands in exactly one of records, duplicates or quarantine.

CREATE TABLE IF NOT EXISTS case_meta (
  key VARCHAR PRIMARY KEY,
  value VARCHAR
);

-- The evidence manifest: one row per input file.
CREATE TABLE IF NOT EXISTS files (
  file_id INTEGER PRIMARY KEY,
  path VARCHAR NOT NULL,
  size BIGINT NOT NULL,
  sha256 VARCHAR NOT NULL UNIQUE,
  format VARCHAR NOT NULL,
  compression VARCHAR NOT NULL,
  ingested_at TIMESTAMPTZ NOT NULL,
  toolkit_version VARCHAR NOT NULL,
  records_read BIGINT NOT NULL,
  adapter VARCHAR NOT NULL,  -- canonical, or the engine-log adapter that translated the file
  lines_ignored BIGINT NOT NULL  -- adapted files: lines that are no event (other log output)
);

-- Files the last ingest that named them could not read (damaged compression, a decompression
-- bomb, a file changed while read, no permission; a folder that cannot be listed): nothing else
-- of them is in the case. A later ingest that
-- reads one takes it off this list.
CREATE TABLE IF NOT EXISTS refused_files (
  path VARCHAR NOT NULL,
  size BIGINT NOT NULL,
  sha256 VARCHAR,  -- NULL where the file could not even be hashed
  why VARCHAR NOT NULL,
  refused_at TIMESTAMPTZ NOT NULL,
  toolkit_version VARCHAR NOT NULL
);

-- What an engine-log adapter said about a file (forensics.adapters.Notes): one row per note, its
-- key (era: the releases whose formats the file shows; role: the file says nothing of its
-- server's role; tenant, bare_time, ...), how many lines or records it is about, and its text.
CREATE TABLE IF NOT EXISTS file_notes (
  file_id INTEGER NOT NULL,
  key VARCHAR NOT NULL,
  count BIGINT NOT NULL,
  text VARCHAR NOT NULL,
  PRIMARY KEY (file_id, key)
);

-- Valid records, one table per kind, each with its kind's fields (records is the five as one).
-- Every table starts with where the record was read and its common fields, and ends with its
-- hash. Its verbatim line is in source_lines. A field of another kind that a record carries is
-- kept in its line, not in a column.
CREATE TABLE IF NOT EXISTS config_records (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  part SMALLINT NOT NULL,  -- which of the records an adapter made of that line (0 for canonical)
  ts TIMESTAMPTZ NOT NULL,
  node VARCHAR NOT NULL,
  boot BIGINT NOT NULL,
  seq BIGINT,
  role VARCHAR,
  engine VARCHAR,
  engine_version VARCHAR,
  model VARCHAR,
  context_length BIGINT,
  page_size BIGINT,
  pool_pages BIGINT,
  kv_bytes_per_token BIGINT,
  step_log_interval BIGINT,  -- v1.1: decode steps between two step records
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR  -- an adapted record: its canonical record as JSON (its line is the engine's); Parquet: the row as JSON
);

CREATE TABLE IF NOT EXISTS request_records (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  part SMALLINT NOT NULL,
  ts TIMESTAMPTZ NOT NULL,
  node VARCHAR NOT NULL,
  boot BIGINT NOT NULL,
  seq BIGINT,
  request_id VARCHAR,
  event VARCHAR,
  tenant_id VARCHAR,
  prompt_tokens BIGINT,
  max_new_tokens BIGINT,
  prefill_node VARCHAR,
  decode_node VARCHAR,
  reason VARCHAR,
  limit_tokens BIGINT,
  status BIGINT,
  finish_reason VARCHAR,
  output_tokens BIGINT,
  cached_tokens BIGINT,  -- v1.1, prefill_started: prompt tokens taken from the prefix cache
  retractions BIGINT,  -- v1.1, finished: times decode retracted the request under memory pressure
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR
);

CREATE TABLE IF NOT EXISTS kv_records (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  part SMALLINT NOT NULL,
  ts TIMESTAMPTZ NOT NULL,
  node VARCHAR NOT NULL,
  boot BIGINT NOT NULL,
  seq BIGINT,
  request_id VARCHAR,
  op VARCHAR,
  pages VARCHAR,
  page_ranges STRUCT(lo BIGINT, hi BIGINT)[],  -- pages as ranges, for analyses that never list pages
  max_page BIGINT,
  source VARCHAR,
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR
);

CREATE TABLE IF NOT EXISTS transfer_records (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  part SMALLINT NOT NULL,
  ts TIMESTAMPTZ NOT NULL,
  node VARCHAR NOT NULL,
  boot BIGINT NOT NULL,
  seq BIGINT,
  transfer_id VARCHAR,
  request_id VARCHAR,
  event VARCHAR,
  src_node VARCHAR,
  dst_node VARCHAR,
  src_pages VARCHAR,
  dst_pages VARCHAR,
  tokens BIGINT,
  bytes BIGINT,
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR
);

-- A decode loop's progress (schema v1.1, docs/schema-v1.1.md): the running batch at a step, and
-- the steps run since the node's previous step record (NULL: its config's step_log_interval;
-- decode_steps gives it resolved). It says nothing about pages. With cache 'flushed' it marks the
-- node's caches emptied while it was idle (SGLang's flush_cache): its step count starts from 0 there.
CREATE TABLE IF NOT EXISTS step_records (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  part SMALLINT NOT NULL,
  ts TIMESTAMPTZ NOT NULL,
  node VARCHAR NOT NULL,
  boot BIGINT NOT NULL,
  seq BIGINT,
  running BIGINT,
  steps BIGINT,
  cache VARCHAR,  -- 'flushed': the node's caches emptied here (SGLang's flush_cache), else NULL
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR
);

-- Every valid record, one column per schema field (NULL where a kind lacks it). A filter on
-- kind reads only that kind's table.
CREATE OR REPLACE VIEW records AS
SELECT file_id, line_no, part, kind, ts, node, boot, seq, request_id, event, op, pages, page_ranges,
       max_page, source, tenant_id, prompt_tokens, max_new_tokens, prefill_node, decode_node, reason,
       limit_tokens, status, finish_reason, output_tokens, cached_tokens, retractions, transfer_id, src_node, dst_node,
       src_pages, dst_pages, tokens, bytes, role, engine, engine_version, model, context_length, page_size,
       pool_pages, kv_bytes_per_token, step_log_interval, running, steps, cache, rec_hash, doc
FROM (
  SELECT 'config' AS kind, * FROM config_records
  UNION ALL BY NAME SELECT 'request' AS kind, * FROM request_records
  UNION ALL BY NAME SELECT 'kv' AS kind, * FROM kv_records
  UNION ALL BY NAME SELECT 'transfer' AS kind, * FROM transfer_records
  UNION ALL BY NAME SELECT 'step' AS kind, * FROM step_records
);

-- Records kept verbatim with the reason they were not ingested.
CREATE TABLE IF NOT EXISTS quarantine (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  reason VARCHAR NOT NULL,
  detail VARCHAR,
  raw VARCHAR NOT NULL USING COMPRESSION zstd,  -- the verbatim line: read rarely, so zstd (the default costs more at ingest)
  rec_hash UHUGEINT
);

-- Byte-for-byte repeats (same canonical JSON) of an ingested record.
CREATE TABLE IF NOT EXISTS duplicates (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR
);

-- The `received` records quarantined as a conflict (log-schema.md section 4): a second received
-- of a request id naming another tenant_id or prompt_tokens than the one kept (the received whose
-- canonical JSON sorts first, and those agreeing with it). Each is its record as it would stand in
-- request_records (a duplicate line of one: `duplicate`, its own file and line), with its
-- canonical JSON and the kept record's place and claim, so that a later file whose received
-- sorts first can turn the outcome over (the same whatever the file order), and the finding
-- evidence.request_id_conflict names every such id.
CREATE TABLE IF NOT EXISTS received_conflicts (
  file_id INTEGER NOT NULL,
  line_no BIGINT NOT NULL,
  part SMALLINT NOT NULL,
  ts TIMESTAMPTZ NOT NULL,
  node VARCHAR NOT NULL,
  boot BIGINT NOT NULL,
  seq BIGINT,
  request_id VARCHAR,
  event VARCHAR,
  tenant_id VARCHAR,
  prompt_tokens BIGINT,
  max_new_tokens BIGINT,
  prefill_node VARCHAR,
  decode_node VARCHAR,
  reason VARCHAR,
  limit_tokens BIGINT,
  status BIGINT,
  finish_reason VARCHAR,
  output_tokens BIGINT,
  cached_tokens BIGINT,
  retractions BIGINT,
  rec_hash UHUGEINT NOT NULL,
  doc VARCHAR,
  duplicate BOOLEAN NOT NULL,
  canon VARCHAR NOT NULL,
  kept_file INTEGER NOT NULL,
  kept_line BIGINT NOT NULL,
  kept_tenant_id VARCHAR,
  kept_prompt_tokens BIGINT
);

-- Every text input file's lines as read (line ends and all; a leading BOM left out), in pieces
-- of about a MiB, each a zstd frame: the verbatim line of every record, duplicate and quarantined
-- line, without a string per record (forensics/ingestion/source.py reads them back; Case.verbatim).
-- JSON Lines number their lines at newlines; CSV and engine logs, read as text, at "\r" too.
CREATE TABLE IF NOT EXISTS source_lines (
  file_id INTEGER NOT NULL,
  first_line BIGINT NOT NULL,
  line_count INTEGER NOT NULL,
  text BLOB NOT NULL
);

CREATE OR REPLACE VIEW file_counts AS
SELECT f.file_id, f.path, f.sha256, f.size, f.format, f.compression, f.ingested_at,
       f.toolkit_version, f.adapter, f.records_read AS read, f.lines_ignored,
       coalesce(r.n, 0) AS ingested, coalesce(d.n, 0) AS duplicates, coalesce(q.n, 0) AS quarantined
FROM files f
LEFT JOIN (SELECT file_id, count(*) AS n FROM records GROUP BY ALL) r USING (file_id)
LEFT JOIN (SELECT file_id, count(*) AS n FROM duplicates GROUP BY ALL) d USING (file_id)
LEFT JOIN (SELECT file_id, count(*) AS n FROM quarantine GROUP BY ALL) q USING (file_id);

-- With what the config admits (reference-engine.md): pool_tokens, SGLang's max_req_input_len,
-- and whether a prefill pool is smaller than the context window it serves.
CREATE OR REPLACE VIEW configs AS
SELECT node, boot, seq, ts, role, engine, engine_version, model, context_length, page_size,
       pool_pages, kv_bytes_per_token, file_id, line_no,
       (pool_pages - 1) * page_size AS pool_tokens,
       least(context_length - 1, (pool_pages - 1) * page_size - 1) - 5 AS max_req_input_len,
       role = 'prefill' AND (pool_pages - 1) * page_size < context_length AS context_exceeds_pool
FROM config_records;

CREATE OR REPLACE VIEW request_events AS
SELECT request_id, event, node, boot, seq, ts, tenant_id, prompt_tokens, max_new_tokens,
       prefill_node, decode_node, reason, limit_tokens, status, finish_reason, output_tokens,
       file_id, line_no
FROM request_records;

-- A decode node's step records (schema v1.1) with the steps each counts: its own, or else the
-- step_log_interval of the node's config in force (the boot's last config at or before it in time;
-- NULL where none says).
CREATE OR REPLACE VIEW decode_steps AS
SELECT s.node, s.boot, s.seq, s.ts, s.running, coalesce(s.steps, c.step_log_interval) AS steps,
       s.steps IS NULL AS steps_from_config, s.cache, s.file_id, s.line_no
FROM step_records s
ASOF LEFT JOIN (SELECT node, boot, ts, step_log_interval FROM config_records) c
  ON s.node = c.node AND s.boot = c.boot AND s.ts >= c.ts;

CREATE OR REPLACE VIEW kv_ops AS
SELECT node, boot, seq, ts, request_id, op, pages, page_ranges, source, file_id, line_no
FROM kv_records;

-- tokens_sent: the record's own tokens, or where it has none (a receiving side that does not
-- say, as SGLang's decode time stats), the sending side's completed record of the same transfer.
-- src_node and dst_node: a side the record could not name ('unknown': an SGLang server's line
-- names only its own node) is the node that logged that side of the same transfer id (for
-- SGLang, the bootstrap room both servers log); 'unknown' where no such record is in the case.
CREATE OR REPLACE VIEW transfers AS
WITH sides AS (
  SELECT transfer_id, min(node) FILTER (WHERE node = src_node) AS sender,
         min(node) FILTER (WHERE node = dst_node) AS receiver
  FROM transfer_records
  WHERE transfer_id IN (SELECT transfer_id FROM transfer_records WHERE src_node = 'unknown' OR dst_node = 'unknown')
  GROUP BY transfer_id)
SELECT t.transfer_id, t.request_id, t.event, t.node, t.boot, t.seq, t.ts,
       CASE WHEN t.src_node = 'unknown' THEN coalesce(s.sender, t.src_node) ELSE t.src_node END AS src_node,
       CASE WHEN t.dst_node = 'unknown' THEN coalesce(s.receiver, t.dst_node) ELSE t.dst_node END AS dst_node,
       t.src_pages, t.dst_pages, t.tokens, t.bytes, t.file_id, t.line_no,
       coalesce(t.tokens, (SELECT min(x.tokens) FROM transfer_records x
                           WHERE x.transfer_id = t.transfer_id
                             AND x.request_id = t.request_id AND x.event = 'completed'
                             AND x.node = x.src_node)) AS tokens_sent
FROM transfer_records t LEFT JOIN sides s USING (transfer_id);

-- Replays of the case through the reference engine (kvforensics replay), latest per what-if.
CREATE TABLE IF NOT EXISTS replays (
  engine VARCHAR NOT NULL,
  what_if VARCHAR NOT NULL,  -- JSON of the counterfactual options, {} for none
  out VARCHAR NOT NULL,
  records BIGINT NOT NULL,
  not_replayed BIGINT NOT NULL,
  exposure VARCHAR NOT NULL,  -- JSON of the eight figures
  agreement VARCHAR,  -- JSON, NULL where the case has no page records
  PRIMARY KEY (engine, what_if)
);
-- (added after schema 5 began: a case made before gets them when next opened to write)
ALTER TABLE replays ADD COLUMN IF NOT EXISTS mode VARCHAR;  -- confirm or what-if (replay/replay.py)
ALTER TABLE replays ADD COLUMN IF NOT EXISTS outcomes_changed BIGINT;  -- delivered in one and not the other
ALTER TABLE replays ADD COLUMN IF NOT EXISTS disagreements BIGINT;  -- confirm: where the logs were followed
ALTER TABLE replays ADD COLUMN IF NOT EXISTS ambiguous_steps BIGINT;  -- decode events the evidence places at more than one step
ALTER TABLE replays ADD COLUMN IF NOT EXISTS assumed VARCHAR;  -- JSON list: what the replay took for granted that the logs do not say
ALTER TABLE replays ADD COLUMN IF NOT EXISTS cache_flushes BIGINT;  -- cache flushes (schema v1.1) the replay applied

-- Confirmation: each place the model could not do what the logs say (the logs were followed there).
CREATE TABLE IF NOT EXISTS replay_disagreements (
  engine VARCHAR NOT NULL,
  what_if VARCHAR NOT NULL,
  request_id VARCHAR NOT NULL,
  node VARCHAR NOT NULL,
  kind VARCHAR NOT NULL,  -- pool_cannot_supply, model_fails_served, model_rejects_served, model_admits_rejected
  detail VARCHAR NOT NULL
);

-- Gaps in a node's seq: records missing there, and the time window they leave without evidence. A
-- boot whose first seq is above 0 (its log's start cut off) misses its records from 0: window_start
-- is NULL there (the boot's start, which no record gives).
CREATE OR REPLACE VIEW seq_gaps AS
SELECT node, boot, prev_seq + 1 AS missing_from, seq - 1 AS missing_to, seq - prev_seq - 1 AS missing,
       prev_ts AS window_start, ts AS window_end
FROM (SELECT node, boot, seq, ts, coalesce(lag(seq) OVER w, -1) AS prev_seq, lag(ts) OVER w AS prev_ts
      FROM records WHERE seq IS NOT NULL
      WINDOW w AS (PARTITION BY node, boot ORDER BY seq))
WHERE seq - prev_seq > 1;

-- Exposures where page records are missing, filled in by the whole job from its replay
-- (forensics/exposure/tiers.py): the columns of exposures, evidence naming the replay tier.
CREATE TABLE IF NOT EXISTS replay_exposures (
  reader_request VARCHAR, victim_request VARCHAR, node VARCHAR, boot BIGINT, pages VARCHAR,
  n_pages BIGINT, first_seq BIGINT, first_ts TIMESTAMP WITH TIME ZONE, inferred BOOLEAN,
  reader_tenant VARCHAR, victim_tenant VARCHAR, reader_delivered BOOLEAN, evidence VARCHAR
);
-- (added after schema 5 began) whether every schedule the evidence allows names the same victim
-- (certain) or not (possible), and why not; a pair only another schedule names has no pages.
ALTER TABLE replay_exposures ADD COLUMN IF NOT EXISTS certainty VARCHAR;
ALTER TABLE replay_exposures ADD COLUMN IF NOT EXISTS certainty_note VARCHAR;
