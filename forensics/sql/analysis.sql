-- Page timelines and exposures (log-schema.md section 5), on page ranges.
-- forensics/sweep.py has already swept every (node, boot) in seq order over an interval map
-- and left sweep_exposures, sweep_uninitialized and sweep_reads (page ranges, integer ids);
-- this names them and aggregates them into the documented tables.

DROP TABLE IF EXISTS page_segments;  -- written by cases analysed before the sweep

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

CREATE OR REPLACE TABLE page_writes AS
SELECT node, boot, rg.lo AS lo, rg.hi AS hi, request_id, seq
FROM (SELECT node, boot, seq, request_id, unnest(page_ranges) AS rg
      FROM records WHERE kind = 'kv' AND op = 'write' AND seq IS NOT NULL)
ORDER BY node, boot, seq, lo;

CREATE OR REPLACE TABLE page_reads AS
SELECT nb.node, nb.boot, r.lo, r.hi, q.request_id, r.start_seq, r.end_seq, r.inferred
FROM sweep_reads r JOIN sweep_node_boots nb USING (nb) JOIN sweep_requests q ON q.rid = r.reader
ORDER BY node, boot, start_seq, lo, request_id;

CREATE OR REPLACE TABLE uninitialized_reads AS
SELECT nb.node, nb.boot, u.lo, u.hi, q.request_id, u.seq, u.inferred
FROM sweep_uninitialized u JOIN sweep_node_boots nb USING (nb) JOIN sweep_requests q ON q.rid = u.reader
ORDER BY node, boot, seq, lo, request_id;

-- Exposures as swept: reader saw a version written by victim, not taken by a share.
CREATE OR REPLACE TEMP TABLE exposure_segments AS
SELECT nb.node, nb.boot, e.lo, e.hi, r.request_id AS reader, v.request_id AS victim,
       e.seq AS seen_seq, e.inferred
FROM sweep_exposures e JOIN sweep_node_boots nb USING (nb)
JOIN sweep_requests r ON r.rid = e.reader JOIN sweep_requests v ON v.rid = e.victim;

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
       coalesce(rq.delivered, FALSE) AS reader_delivered,
       CASE WHEN g.inferred THEN 'page records, read inferred' ELSE 'page records' END AS evidence
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
