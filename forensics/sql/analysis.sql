-- Page timelines and exposures (log-schema.md section 5), computed on page ranges.
-- Each (node, boot)'s page ids are cut into elementary segments at every range boundary:
-- all pages of a segment share one history. The cost follows the number of segments each
-- range covers: small when boundaries are sparse, but on a long boot the boundaries of all
-- requests accumulate until nearly every page id is one, and the cost becomes per page
-- (bench/bench_investigate.py measures it; a per-(node, boot) interval-map sweep is the fix).

-- One row per page range of a kv record.
CREATE OR REPLACE TEMP TABLE kv_ranges AS
SELECT node, boot, seq, request_id, op, rg.lo AS lo, rg.hi AS hi
FROM (SELECT node, boot, seq, request_id, op, unnest(page_ranges) AS rg
      FROM records WHERE kind = 'kv');

-- Segment boundaries per (node, boot), numbered.
CREATE OR REPLACE TEMP TABLE bounds AS
SELECT node, boot, b, (row_number() OVER (PARTITION BY node, boot ORDER BY b) - 1)::BIGINT AS idx
FROM (SELECT DISTINCT node, boot, b FROM (
        SELECT node, boot, lo AS b FROM kv_ranges
        UNION ALL SELECT node, boot, hi + 1 FROM kv_ranges));

-- The first global segment number of each (node, boot).
CREATE OR REPLACE TEMP TABLE node_boots AS
SELECT node, boot, (sum(n) OVER (ORDER BY node, boot) - n)::BIGINT AS seg_base
FROM (SELECT node, boot, count(*) - 1 AS n FROM bounds GROUP BY ALL);

CREATE OR REPLACE TABLE page_segments AS
SELECT node, boot, idx AS seg, b AS lo, lead(b) OVER (PARTITION BY node, boot ORDER BY b) - 1 AS hi
FROM bounds QUALIFY hi IS NOT NULL;

-- Every kv op on every segment it covers.
CREATE OR REPLACE TEMP TABLE seg_ops AS
SELECT DISTINCT r.node, r.boot, unnest(range(b1.idx, b2.idx)) AS seg, r.seq, r.request_id, r.op
FROM kv_ranges r
JOIN bounds b1 ON b1.node = r.node AND b1.boot = r.boot AND b1.b = r.lo
JOIN bounds b2 ON b2.node = r.node AND b2.boot = r.boot AND b2.b = r.hi + 1;

CREATE OR REPLACE TEMP TABLE seg_writes AS
SELECT o.node, o.boot, o.seg, o.seq, o.request_id,
       ((nb.seg_base + o.seg)::HUGEINT << 64) + o.seq AS k
FROM seg_ops o JOIN node_boots nb USING (node, boot) WHERE o.op = 'write';

-- Inferred reads: a request with no read record on a node reads, at its decode_started
-- there, every page it holds (its last alloc/share/free of the segment before is a take).
CREATE OR REPLACE TEMP TABLE inferred_reads AS
WITH starts AS (
  SELECT node, boot, seq AS d, request_id FROM records
  WHERE kind = 'request' AND event = 'decode_started' AND seq IS NOT NULL
    AND (node, request_id) NOT IN (
      SELECT DISTINCT node, request_id FROM records WHERE kind = 'kv' AND op = 'read')
), hold_ops AS (
  SELECT node, boot, seg, request_id, seq, op FROM seg_ops WHERE op IN ('alloc', 'share', 'free')
), candidates AS (
  SELECT DISTINCT h.node, h.boot, h.seg, h.request_id, s.d
  FROM hold_ops h JOIN starts s USING (node, boot, request_id)
)
SELECT c.node, c.boot, c.seg, c.request_id, c.d AS seq
FROM candidates c ASOF JOIN hold_ops h
  ON c.node = h.node AND c.boot = h.boot AND c.seg = h.seg AND c.request_id = h.request_id
 AND c.d > h.seq
WHERE h.op IN ('alloc', 'share');

-- Reading intervals: from a read to the reader's next free of the segment (or boot end).
CREATE OR REPLACE TEMP TABLE seg_reads AS
WITH starts AS (
  SELECT node, boot, seg, request_id, seq, FALSE AS inferred FROM seg_ops WHERE op = 'read'
  UNION ALL
  SELECT node, boot, seg, request_id, seq, TRUE FROM inferred_reads
), frees AS (
  SELECT node, boot, seg, request_id, seq FROM seg_ops WHERE op = 'free'
), ended AS (
  SELECT s.*, f.seq AS end_seq
  FROM starts s ASOF LEFT JOIN frees f
    ON s.node = f.node AND s.boot = f.boot AND s.seg = f.seg AND s.request_id = f.request_id
   AND s.seq < f.seq
)
SELECT node, boot, seg, request_id, min(seq) AS start_seq, end_seq,
       arg_min(inferred, seq) AS inferred
FROM ended GROUP BY node, boot, seg, request_id, end_seq;

-- Versions the reader sees: the one current when the interval starts, and every later
-- write before it ends.
CREATE OR REPLACE TEMP TABLE seen AS
WITH first_version AS (
  SELECT r.node, r.boot, r.seg, r.request_id AS reader, r.start_seq, r.inferred,
         w.request_id AS writer, w.seq AS write_seq, r.start_seq AS seen_seq
  FROM seg_reads r ASOF LEFT JOIN seg_writes w
    ON r.node = w.node AND r.boot = w.boot AND r.seg = w.seg AND r.start_seq > w.seq
), keyed AS (
  SELECT r.*, ((nb.seg_base + r.seg)::HUGEINT << 64) + r.start_seq AS k_start,
         ((nb.seg_base + r.seg)::HUGEINT << 64) + coalesce(r.end_seq, 9223372036854775807) AS k_end
  FROM seg_reads r JOIN node_boots nb USING (node, boot)
), later AS (
  SELECT r.node, r.boot, r.seg, r.request_id AS reader, r.start_seq, r.inferred,
         w.request_id AS writer, w.seq AS write_seq, w.seq AS seen_seq
  FROM keyed r JOIN seg_writes w ON w.k > r.k_start AND w.k < r.k_end
)
SELECT * FROM first_version UNION ALL SELECT * FROM later;

-- Versions a request took legitimately with a share.
CREATE OR REPLACE TEMP TABLE shared_versions AS
SELECT s.node, s.boot, s.seg, s.request_id AS reader, w.request_id AS writer, w.seq AS write_seq
FROM (SELECT * FROM seg_ops WHERE op = 'share') s
ASOF JOIN seg_writes w ON s.node = w.node AND s.boot = w.boot AND s.seg = w.seg AND s.seq > w.seq;

-- Per request: tenant, and whether its response was delivered.
CREATE OR REPLACE TABLE requests AS
SELECT request_id,
       min(tenant_id) FILTER (WHERE event = 'received') AS tenant_id,
       min(prompt_tokens) FILTER (WHERE event = 'received') AS prompt_tokens,
       bool_or(event = 'rejected') AS rejected,
       max(status) FILTER (WHERE event = 'finished') AS status,
       coalesce(bool_or(event = 'finished' AND status BETWEEN 200 AND 299), FALSE)
         AND NOT coalesce(bool_or(event = 'finished' AND status >= 400), FALSE) AS delivered,
       min(ts) AS first_ts, max(ts) AS last_ts
FROM records WHERE kind = 'request' GROUP BY request_id;

CREATE OR REPLACE TABLE page_reads AS
SELECT r.node, r.boot, s.lo, s.hi, r.request_id, r.start_seq, r.end_seq, r.inferred
FROM seg_reads r JOIN page_segments s USING (node, boot, seg);

CREATE OR REPLACE TABLE page_writes AS
SELECT w.node, w.boot, s.lo, s.hi, w.request_id, w.seq
FROM seg_writes w JOIN page_segments s USING (node, boot, seg);

-- Exposures at segment level: a version written by another request, not taken by a share.
CREATE OR REPLACE TEMP TABLE exposure_segments AS
SELECT x.node, x.boot, x.seg, g.lo, g.hi, x.reader, x.writer AS victim, x.seen_seq, x.inferred
FROM seen x JOIN page_segments g USING (node, boot, seg)
WHERE x.writer IS NOT NULL AND x.writer <> x.reader
  AND NOT EXISTS (
    SELECT 1 FROM shared_versions v
    WHERE v.node = x.node AND v.boot = x.boot AND v.seg = x.seg AND v.reader = x.reader
      AND v.writer = x.writer AND v.write_seq = x.write_seq);

CREATE OR REPLACE TABLE uninitialized_reads AS
SELECT x.node, x.boot, g.lo, g.hi, x.reader AS request_id, x.seen_seq AS seq, x.inferred
FROM seen x JOIN page_segments g USING (node, boot, seg)
WHERE x.writer IS NULL;

-- Exposures: one row per (reader, victim, node, boot), pages merged into ranges.
CREATE OR REPLACE TABLE exposures AS
WITH islands AS (
  SELECT *, sum(new_island) OVER (PARTITION BY reader, victim, node, boot ORDER BY lo) AS island
  FROM (SELECT *, CASE WHEN lo > max(hi) OVER (
                       PARTITION BY reader, victim, node, boot ORDER BY lo
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) + 1
                       THEN 1 ELSE 0 END AS new_island
        FROM (SELECT reader, victim, node, boot, lo, hi, min(seen_seq) AS seen_seq,
                     bool_or(inferred) AS inferred
              FROM exposure_segments GROUP BY ALL))
), ranges AS (
  SELECT reader, victim, node, boot, min(lo) AS lo, max(hi) AS hi, min(seen_seq) AS seen_seq,
         bool_or(inferred) AS inferred
  FROM islands GROUP BY reader, victim, node, boot, island
), grouped AS (
  SELECT reader, victim, node, boot,
         string_agg(CASE WHEN lo = hi THEN lo::VARCHAR ELSE lo || '-' || hi END, ',' ORDER BY lo) AS pages,
         sum(hi - lo + 1)::BIGINT AS n_pages, min(seen_seq) AS first_seq, bool_or(inferred) AS inferred
  FROM ranges GROUP BY ALL
)
SELECT g.reader AS reader_request, g.victim AS victim_request, g.node, g.boot, g.pages, g.n_pages,
       g.first_seq, t.ts AS first_ts, g.inferred,
       rq.tenant_id AS reader_tenant, vq.tenant_id AS victim_tenant,
       coalesce(rq.delivered, FALSE) AS reader_delivered
FROM grouped g
LEFT JOIN requests rq ON rq.request_id = g.reader
LEFT JOIN requests vq ON vq.request_id = g.victim
LEFT JOIN (SELECT node, boot, seq, min(ts) AS ts FROM records WHERE seq IS NOT NULL GROUP BY ALL) t
  ON t.node = g.node AND t.boot = g.boot AND t.seq = g.first_seq;

-- Distinct (request, node, page) counts over any boots: the length of a union of ranges.
CREATE OR REPLACE TEMP MACRO union_pages(tbl) AS TABLE
SELECT coalesce(sum(hi - lo + 1), 0)::BIGINT AS n FROM (
  SELECT request_id, node, min(lo) AS lo, max(hi) AS hi FROM (
    SELECT *, sum(new_island) OVER (PARTITION BY request_id, node ORDER BY lo, hi) AS island FROM (
      SELECT *, CASE WHEN lo > max(hi) OVER (PARTITION BY request_id, node ORDER BY lo, hi
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 1 ELSE 0 END AS new_island
      FROM query_table(tbl)))
  GROUP BY request_id, node, island);

CREATE OR REPLACE TEMP TABLE delivered_exposed_ranges AS
SELECT reader AS request_id, e.node, lo, hi FROM exposure_segments e
JOIN requests r ON r.request_id = e.reader WHERE r.delivered;

CREATE OR REPLACE TEMP TABLE uninitialized_ranges AS
SELECT request_id, node, lo, hi FROM uninitialized_reads;

CREATE OR REPLACE TABLE exposure_summary AS
WITH d AS (SELECT * FROM exposures WHERE reader_delivered)
SELECT
  (SELECT count(DISTINCT reader_request) FROM d)::BIGINT AS exposed_responses,
  (SELECT count(DISTINCT reader_request) FROM exposures WHERE NOT reader_delivered)::BIGINT AS contained_requests,
  (SELECT count(DISTINCT victim_request) FROM d)::BIGINT AS victim_requests,
  (SELECT count(*) FROM (SELECT DISTINCT reader_request, victim_request FROM d))::BIGINT AS exposure_pairs,
  (SELECT count(*) FROM (SELECT DISTINCT reader_request, victim_request FROM d
                         WHERE reader_tenant <> victim_tenant))::BIGINT AS cross_tenant_pairs,
  (SELECT n FROM union_pages('delivered_exposed_ranges')) AS exposed_page_reads,
  (SELECT n FROM union_pages('uninitialized_ranges')) AS uninitialized_reads,
  (SELECT count(DISTINCT victim_tenant) FROM d)::BIGINT AS affected_tenants;
