-- Where a node's decode retracted requests under memory pressure, which the replay does not model
-- (forensics/exposure/tiers.py, _not_ruled_out), on the replay case: `retracted` (registered) holds
-- each such (node, request_id), and (node, '') where the node's scheduler logged retractions (step
-- records with cache 'retracted': SGLang's "KV cache pool is full. Retract requests." line, which
-- names no request). A request's pages went at the first such line while it ran (from its
-- decode_started to its finish), or, where none was logged then, at a moment the logs do not give
-- from its decode_started on (retraction_of). Until the first retraction (each boot:
-- retraction_splits) the node did what the replay did; from there on its pages are one layout of
-- several, the same requests writing and freeing them at the same moments, on pages the replay
-- cannot name.
--
-- retraction_bounds: each reader on such a boot, with where it took its pages (its first page
-- alloc there; a reader the node retracted itself may have taken others up to its last page
-- record) and whether that was at the split or after (`after`): its victims then rest on pages
-- the replay cannot name.
--
-- admitted, not_ruled_out: for each such reader, every request whose data may have been in the
-- node's pool when it took its pages: what a page held at the split (its last writer there, as
-- replayed: the node did what the replay did until then) or what was written after it, by a request
-- that had let its pages go before the reader took them (a retracted one from its retraction). The
-- reader itself is left out: its own data is no exposure.

-- name: prepare
CREATE OR REPLACE TEMP TABLE retraction_lines AS
SELECT r.node, r.boot, r.seq
FROM records r
WHERE r.kind = 'step' AND r.cache = 'retracted' AND r.seq IS NOT NULL
  AND r.node IN (SELECT node FROM retracted);

CREATE OR REPLACE TEMP TABLE retraction_of AS
WITH runs AS (
  SELECT s.node, s.boot, s.request_id, s.seq AS started,
         (SELECT min(f.seq) FROM records f
          WHERE f.node = s.node AND f.boot = s.boot AND f.request_id = s.request_id AND f.kind = 'request'
            AND f.event = 'finished' AND f.seq > s.seq) AS finished
  FROM records s JOIN retracted USING (node, request_id)
  WHERE s.kind = 'request' AND s.event = 'decode_started' AND s.seq IS NOT NULL
)
SELECT u.node, u.boot, u.request_id,
       coalesce((SELECT min(l.seq) FROM retraction_lines l
                 WHERE l.node = u.node AND l.boot = u.boot AND l.seq > u.started
                   AND l.seq < coalesce(u.finished, 9223372036854775807)), u.started) AS seq
FROM runs u;

CREATE OR REPLACE TEMP TABLE retraction_splits AS
SELECT node, boot, min(seq) AS seq
FROM (SELECT node, boot, seq FROM retraction_of UNION ALL SELECT node, boot, seq FROM retraction_lines)
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE retraction_bounds AS
WITH readers AS (
  SELECT DISTINCT e.node, e.boot, e.reader_request FROM exposures e JOIN retraction_splits USING (node, boot)
), taken AS (
  SELECT k.node, k.boot, k.request_id,
         CASE WHEN any_value(t.request_id) IS NULL THEN min(k.seq) FILTER (WHERE k.op = 'alloc')
              ELSE max(k.seq) END AS seq
  FROM kv_ops k
  JOIN readers d ON d.node = k.node AND d.boot = k.boot AND d.reader_request = k.request_id
  LEFT JOIN retracted t ON t.node = k.node AND t.request_id = k.request_id
  GROUP BY k.node, k.boot, k.request_id
)
SELECT d.node, d.boot, d.reader_request, t.seq AS taken_seq, coalesce(t.seq >= s.seq, TRUE) AS after
FROM readers d JOIN retraction_splits s USING (node, boot)
LEFT JOIN taken t ON t.node = d.node AND t.boot = d.boot AND t.request_id = d.reader_request;

-- (a request is named for every reader that took its pages after it was `admitted`: once its data was
-- in the pool and it had let its pages go; the pairs are counted before they are listed)
CREATE OR REPLACE TEMP TABLE admitted AS
WITH residue AS (
  SELECT node, boot, arg_max(request_id, seq) AS request_id
  FROM (SELECT w.node, w.boot, w.request_id, w.seq, unnest(range(w.lo, w.hi + 1)) AS page
        FROM page_writes w JOIN retraction_splits s USING (node, boot) WHERE w.seq < s.seq)
  GROUP BY node, boot, page
), in_pool AS (  -- a request's data in the pool from `since` on
  SELECT r.node, r.boot, r.request_id, s.seq AS since
  FROM residue r JOIN retraction_splits s USING (node, boot)
  UNION ALL
  SELECT w.node, w.boot, w.request_id, w.seq AS since
  FROM page_writes w JOIN retraction_splits s USING (node, boot)
  WHERE w.seq >= s.seq
), released AS (  -- where a request had let its pages go
  SELECT k.node, k.boot, k.request_id, k.seq
  FROM kv_ops k JOIN retraction_splits USING (node, boot)
  WHERE k.op = 'free'
  UNION ALL
  SELECT node, boot, request_id, seq FROM retraction_of
)
SELECT p.node, p.boot, p.request_id, greatest(min(p.since), any_value(f.seq)) AS seq
FROM in_pool p
JOIN (SELECT node, boot, request_id, min(seq) AS seq FROM released GROUP BY ALL) f USING (node, boot, request_id)
GROUP BY p.node, p.boot, p.request_id;

-- name: not_ruled_out_pairs
SELECT count(*) FROM retraction_bounds b JOIN admitted a ON a.node = b.node AND a.boot = b.boot AND a.seq < b.taken_seq
WHERE b.after AND a.request_id <> b.reader_request;

-- name: not_ruled_out
SELECT b.node, b.boot, b.reader_request, a.request_id AS victim_request, q.tenant_id AS victim_tenant
FROM retraction_bounds b
JOIN admitted a ON a.node = b.node AND a.boot = b.boot AND a.seq < b.taken_seq
LEFT JOIN requests q ON q.request_id = a.request_id
WHERE b.after AND a.request_id <> b.reader_request
ORDER BY ALL;
