-- Page timelines and exposures (log-schema.md section 5), on page ranges.
-- forensics/exposure/sweep.py has already swept every (node, boot) in seq order over an interval map
-- and left sweep_exposures (merged per reader, victim, node, boot), sweep_uninitialized and
-- sweep_reads (page ranges, integer ids);
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

-- The content versions: a view over the write records, nothing to copy.
CREATE OR REPLACE VIEW page_writes AS
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

-- Per request id of the sweep: its name, tenant and whether its response was delivered.
CREATE OR REPLACE TEMP TABLE sweep_request_facts AS
SELECT q.rid, q.request_id, r.tenant_id, coalesce(r.delivered, FALSE) AS delivered
FROM sweep_requests q LEFT JOIN requests r USING (request_id);

-- Exposures: one row per (reader, victim, node, boot). The sweep has merged the pages of each
-- into maximal ranges, each with the first seq (and its ts) the reader saw any of them.
CREATE OR REPLACE TABLE exposures AS
WITH grouped AS (
  SELECT nb, reader, victim,
         string_agg(CASE WHEN lo = hi THEN lo::VARCHAR ELSE lo || '-' || hi END, ',' ORDER BY lo) AS pages,
         sum(hi - lo + 1)::BIGINT AS n_pages, min(seq) AS first_seq, arg_min(ts, seq) AS first_ts,
         bool_or(inferred) AS inferred
  FROM sweep_exposures GROUP BY nb, reader, victim
)
SELECT r.request_id AS reader_request, v.request_id AS victim_request, nb.node, nb.boot, g.pages,
       g.n_pages, g.first_seq, g.first_ts, g.inferred,
       r.tenant_id AS reader_tenant, v.tenant_id AS victim_tenant, r.delivered AS reader_delivered,
       CASE WHEN g.inferred THEN 'page records, read inferred' ELSE 'page records' END AS evidence
FROM grouped g
JOIN sweep_node_boots nb USING (nb)
JOIN sweep_request_facts r ON r.rid = g.reader
JOIN sweep_request_facts v ON v.rid = g.victim;

-- Distinct (request, node, page) counts over any boots: the length of a union of ranges.
CREATE OR REPLACE TEMP MACRO union_pages(tbl) AS TABLE
SELECT coalesce(sum(hi - lo + 1), 0)::BIGINT AS n FROM (
  SELECT rid, node_id, min(lo) AS lo, max(hi) AS hi FROM (
    SELECT *, sum(new_island) OVER (PARTITION BY rid, node_id ORDER BY lo, hi) AS island FROM (
      SELECT *, CASE WHEN lo > max(hi) OVER (PARTITION BY rid, node_id ORDER BY lo, hi
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 1 ELSE 0 END AS new_island
      FROM query_table(tbl)))
  GROUP BY rid, node_id, island);

CREATE OR REPLACE TEMP TABLE delivered_exposed_ranges AS
SELECT e.reader AS rid, nb.node_id, e.lo, e.hi FROM sweep_exposures e
JOIN sweep_node_boots nb USING (nb) JOIN sweep_request_facts r ON r.rid = e.reader
WHERE r.delivered;

CREATE OR REPLACE TEMP TABLE uninitialized_ranges AS
SELECT u.reader AS rid, nb.node_id, u.lo, u.hi FROM sweep_uninitialized u
JOIN sweep_node_boots nb USING (nb);

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
