-- Settling a file's records once they are in (forensics/ingestion/settle.py): repeats become
-- duplicates, conflicts and pages beyond the pool go to quarantine. One statement per block,
-- headed `-- name:`; $file_id is the file being settled, $lo to $hi the files settled together
-- (every file of the case before them; one file: $lo = $hi). Tables named TEMP are the steps'
-- scratch, dropped by the step that made them.

-- name: file_seq_ranges
-- Per (node, boot), the file's seq range and count.
SELECT node, boot, min(seq), max(seq), count(*) FROM records
WHERE file_id = $file_id AND seq IS NOT NULL GROUP BY ALL;

-- name: other_seq_ranges
-- The seq range of every other file on the file's nodes, per (node, boot).
SELECT node, boot, min(seq), max(seq) FROM records
WHERE file_id <> $file_id AND seq IS NOT NULL
  AND node IN (SELECT DISTINCT node FROM records WHERE file_id = $file_id)
GROUP BY node, boot, file_id;

-- name: file_seqs
-- The file's seqs on one (node, boot).
SELECT seq FROM records WHERE file_id = $file_id AND node = $node AND boot = $boot AND seq IS NOT NULL;

-- name: file_keys_repeat
-- Whether any (node, boot, seq) of the file's is on two of its records.
SELECT EXISTS (SELECT 1 FROM records WHERE file_id = $file_id AND seq IS NOT NULL
               GROUP BY node, boot, seq HAVING count(*) > 1);

-- name: repeats
-- The records of the files $lo to $hi that repeat one read before them: in an earlier file, or
-- on an earlier line of their own (with $only_without_seq, records with a seq are known not to
-- repeat: their keys are unique).
CREATE OR REPLACE TEMP TABLE repeats AS
WITH hot AS (
  SELECT rec_hash FROM records
  WHERE NOT $only_without_seq OR seq IS NULL
  GROUP BY rec_hash HAVING count(*) > 1 AND bool_or(file_id BETWEEN $lo AND $hi)
)
SELECT file_id, line_no, part FROM (
  SELECT r.file_id, r.line_no, r.part,
         row_number() OVER (PARTITION BY r.rec_hash ORDER BY r.file_id, r.line_no, r.part) AS occ
  FROM records r SEMI JOIN hot h USING (rec_hash))
WHERE occ > 1 AND file_id BETWEEN $lo AND $hi;

-- name: repeats_to_duplicates
INSERT INTO duplicates SELECT file_id, line_no, rec_hash, doc
FROM records SEMI JOIN repeats USING (file_id, line_no, part) WHERE file_id BETWEEN $lo AND $hi;

-- name: keys_shared
-- Whether a (node, boot, seq) of the files $lo to $hi is on another record, theirs or the case's.
WITH mine AS (SELECT node, boot, seq FROM records WHERE file_id BETWEEN $lo AND $hi AND seq IS NOT NULL)
SELECT (SELECT count(*) FROM mine) > (SELECT count(*) FROM (SELECT DISTINCT node, boot, seq FROM mine))
    OR EXISTS (SELECT 1 FROM records r SEMI JOIN mine USING (node, boot, seq) WHERE r.file_id < $lo);

-- name: beyond_possible
-- Whether settling the files $lo to $hi one by one could find a page record beyond the pool: one
-- of theirs, or of a node they bring a config of, with a page at or past the pool of the case's
-- config in force or of any of their configs before it (each may be in force when it is checked).
WITH cfg_case AS (
  SELECT node, (boot::HUGEINT << 64) + coalesce(seq, -1) AS ord, min(pool_pages) AS pool
  FROM config_records WHERE file_id < $lo GROUP BY ALL
), cfg_new AS (
  SELECT node, (boot::HUGEINT << 64) + coalesce(seq, -1) AS ord,
         min(pool_pages) OVER (PARTITION BY node ORDER BY (boot::HUGEINT << 64) + coalesce(seq, -1)) AS pool
  FROM config_records WHERE file_id BETWEEN $lo AND $hi
), kv AS (
  SELECT node, (boot::HUGEINT << 64) + seq AS ord, max_page FROM kv_records
  WHERE file_id BETWEEN $lo AND $hi OR node IN (SELECT node FROM cfg_new)
)
SELECT EXISTS (SELECT 1 FROM kv ASOF JOIN cfg_case c ON kv.node = c.node AND kv.ord >= c.ord
               WHERE kv.max_page >= c.pool)
    OR EXISTS (SELECT 1 FROM kv ASOF JOIN cfg_new c ON kv.node = c.node AND kv.ord >= c.ord
               WHERE kv.max_page >= c.pool);

-- name: contested
-- The (node, boot, seq) keys the file shares with another record.
CREATE OR REPLACE TEMP TABLE contested AS
SELECT node, boot, seq FROM records WHERE seq IS NOT NULL
GROUP BY ALL HAVING count(*) > 1 AND bool_or(file_id = $file_id);

-- name: rivals
-- Every contender on a contested key.
CREATE OR REPLACE TEMP TABLE rivals AS
SELECT r.file_id, r.line_no, r.doc, r.rec_hash
FROM records r SEMI JOIN contested c ON r.node = c.node AND r.boot = c.boot AND r.seq = c.seq;

-- name: rival_lines
-- The contenders' lines as read (`texts`), to recompute their canonical JSON.
CREATE OR REPLACE TEMP TABLE rival_lines AS
SELECT row_number() OVER () AS line_no, 0 AS part, coalesce(t.text, r.doc) AS raw, r.doc,
       r.file_id AS c_file, r.line_no AS c_line, r.rec_hash AS c_hash
FROM rivals r LEFT JOIN texts t USING (file_id, line_no);

-- name: losers
-- Of each contested key's contenders, all but the one whose canonical JSON sorts first.
CREATE OR REPLACE TEMP TABLE losers AS
SELECT c.*, w.file_id AS w_file, w.line_no AS w_line FROM contenders c
JOIN (SELECT node, boot, seq, arg_min(struct_pack(file_id, line_no, canon), canon) AS w
      FROM contenders GROUP BY ALL) USING (node, boot, seq)
WHERE c.canon <> w.canon;

-- name: beyond
-- Page records with ids beyond the pool of the node's config in force: the file's own, and
-- all of a node's where the file brought one of its configs.
CREATE OR REPLACE TEMP TABLE beyond AS
WITH cfg AS (
  SELECT node, (boot::HUGEINT << 64) + coalesce(seq, -1) AS ord, pool_pages,
         file_id AS c_file, line_no AS c_line
  FROM config_records
), kv AS (
  SELECT file_id, line_no, node, (boot::HUGEINT << 64) + seq AS ord, max_page, rec_hash
  FROM kv_records
  WHERE file_id = $file_id OR node IN (SELECT node FROM config_records WHERE file_id = $file_id)
)
SELECT kv.file_id, kv.line_no, kv.rec_hash,
       'page ' || kv.max_page || ' is beyond pool_pages ' || cfg.pool_pages
       || ' of the config at file ' || c_file || ' line ' || c_line AS detail
FROM kv ASOF JOIN cfg ON kv.node = cfg.node AND kv.ord >= cfg.ord
WHERE kv.max_page >= cfg.pool_pages;

-- name: received_disputed
-- The request ids the files $lo to $hi bring a `received` record of ($lo NULL: every file) whose
-- received records, kept and held in received_conflicts, name two tenants or two prompt lengths.
CREATE OR REPLACE TEMP TABLE disputed AS
WITH ids AS (
  SELECT DISTINCT request_id FROM request_records
  WHERE event = 'received' AND ($lo IS NULL OR file_id BETWEEN $lo AND $hi)
), claims AS (
  SELECT request_id, tenant_id, prompt_tokens FROM request_records SEMI JOIN ids USING (request_id)
  WHERE event = 'received'
  UNION ALL
  SELECT request_id, tenant_id, prompt_tokens FROM received_conflicts SEMI JOIN ids USING (request_id)
)
SELECT request_id FROM claims GROUP BY request_id
HAVING count(DISTINCT struct_pack(tenant_id, prompt_tokens)) > 1;

-- name: received_lines
-- The received records of the disputed ids as read (`texts`), to recompute their canonical JSON.
CREATE OR REPLACE TEMP TABLE received_lines AS
SELECT row_number() OVER () AS line_no, 0 AS part, coalesce(t.text, r.doc) AS raw, r.doc,
       r.file_id AS c_file, r.line_no AS c_line, r.rec_hash AS c_hash,
       r.request_id AS c_request, r.tenant_id AS c_tenant, r.prompt_tokens AS c_prompt
FROM received_rivals r LEFT JOIN texts t USING (file_id, line_no);

-- name: received_winners
-- Per disputed id, the claim kept: the received record whose canonical JSON sorts first.
CREATE OR REPLACE TEMP TABLE received_winners AS
SELECT request_id, w.file_id AS w_file, w.line_no AS w_line, w.tenant_id AS w_tenant,
       w.prompt_tokens AS w_prompt
FROM (SELECT request_id,
             arg_min(struct_pack(file_id, line_no, tenant_id, prompt_tokens),
                     struct_pack(canon, file_id, line_no)) AS w
      FROM claimants GROUP BY request_id);

-- name: received_losers
-- The kept received records (not held) whose claim is not the winner's.
CREATE OR REPLACE TEMP TABLE losers AS
SELECT c.*, w.w_file AS kept_file, w.w_line AS kept_line, w.w_tenant AS kept_tenant_id,
       w.w_prompt AS kept_prompt_tokens
FROM claimants c JOIN received_winners w USING (request_id)
WHERE NOT c.held
  AND (c.tenant_id IS DISTINCT FROM w.w_tenant OR c.prompt_tokens IS DISTINCT FROM w.w_prompt);

-- name: received_restored
-- The held records whose claim is now the winner's: back to records (the first of a record hash
-- not already there) or duplicates.
CREATE OR REPLACE TEMP TABLE restored AS
SELECT h.*, h.duplicate OR h.rec_hash IN (SELECT rec_hash FROM request_records)
         OR row_number() OVER (PARTITION BY h.rec_hash ORDER BY h.duplicate, h.file_id, h.line_no, h.part) > 1
         AS to_duplicates
FROM received_conflicts h JOIN received_winners w USING (request_id)
WHERE h.tenant_id IS NOT DISTINCT FROM w.w_tenant AND h.prompt_tokens IS NOT DISTINCT FROM w.w_prompt;
