-- Where a node's pages are not the replay's from some point on (forensics/exposure/tiers.py,
-- _not_ruled_out), on the replay case. Three registered tables say where:
-- - `retracted`: each (node, request_id) a node's decode retracted under memory pressure, which the
--   replay does not model, and (node, '') where the node's scheduler logged retractions (step records
--   with cache 'retracted': SGLang's "KV cache pool is full. Retract requests." line, which names no
--   request). A request's pages went at the first such line while it ran (from its decode_started to
--   its finish), or, where none was logged then, at a moment the logs do not give from its
--   decode_started on (retraction_of). Until the first retraction (each boot) the node did what the
--   replay did; from there on its pages are one layout of several, the same requests writing and
--   freeing them at the same moments, on pages the replay cannot name.
-- - `whole_nodes`: the nodes whose replay did not follow their logs everywhere for another reason
--   (replay_disagreements: a pool that could not supply pages the logs show taken, what the replay
--   does not model from the boot's start, ...): the replay cannot say from where its pages are no
--   longer the node's, so from each boot's start (seq -1).
-- - `unsupplied`: each (node, request_id) the replay could not give its pages there although the logs
--   show it served and its transfer carried fewer pages than its prompt: it read pages it did not
--   write (its decode_started), on a layout the replay cannot name.
-- retraction_splits: each such (node, boot), from where (seq) its pages are not the replay's, and
-- whether that is the boot's start for a reason other than retractions (`whole`).
--
-- retraction_bounds: each reader on such a boot (one the replay names victims of, `named`; one that read
-- pages holding nothing in the replay, or an unsupplied one: on the node's pages they may have held
-- another's data), with where it took its pages (its first page alloc there; a reader the node
-- retracted itself may have taken others up to its last page record; an unsupplied one, no later than
-- its decode_started) and whether that was at the split or after (`after`): its victims then rest on
-- pages the replay cannot name.
--
-- admitted, not_ruled_out: for each such reader, every request whose data may have been in the
-- node's pool when it took its pages: what a page held at the split (its last writer there, as
-- replayed: the node did what the replay did until then) or what was written after it, by a request
-- that had let its pages go before the reader took them (a retracted one from its retraction; one the
-- replay gave no pages, from its admission to its finish, as the logs show them). The reader itself
-- is left out: its own data is no exposure.

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
SELECT node, boot, min(seq) AS seq, bool_or(whole) AS whole
FROM (SELECT node, boot, seq, FALSE AS whole FROM retraction_of
      UNION ALL SELECT node, boot, seq, FALSE FROM retraction_lines
      UNION ALL SELECT DISTINCT node, boot, -1, TRUE FROM records
                WHERE seq IS NOT NULL AND node IN (SELECT node FROM whole_nodes))
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE retraction_bounds AS
WITH bounds AS (
WITH readers AS (  -- (a reader whose pages held nothing in the replay may have read another's data on the node's)
  SELECT e.node, e.boot, e.reader_request, TRUE AS named FROM exposures e JOIN retraction_splits USING (node, boot)
  UNION
  SELECT u.node, u.boot, u.request_id, FALSE FROM uninitialized_reads u JOIN retraction_splits s USING (node, boot)
  WHERE u.seq >= s.seq  -- (before the split the node's pages were the replay's: they held nothing)
), unsupplied_at AS (  -- (a reader the replay gave no pages: they were taken by its decode_started at the latest)
  SELECT r.node, r.boot, r.request_id AS reader_request, min(r.seq) AS taken_seq
  FROM records r JOIN unsupplied u USING (node, request_id)
  WHERE r.kind = 'request' AND r.event = 'decode_started' AND r.seq IS NOT NULL
  GROUP BY ALL
), taken AS (
  SELECT k.node, k.boot, k.request_id,
         CASE WHEN any_value(t.request_id) IS NULL THEN min(k.seq) FILTER (WHERE k.op = 'alloc')
              ELSE max(k.seq) END AS seq
  FROM kv_ops k
  JOIN readers d ON d.node = k.node AND d.boot = k.boot AND d.reader_request = k.request_id
  LEFT JOIN retracted t ON t.node = k.node AND t.request_id = k.request_id
  GROUP BY k.node, k.boot, k.request_id
)
SELECT node, boot, reader_request, min(taken_seq) AS taken_seq, bool_or(after) AS after,
       bool_or(unsupplied) AS unsupplied, bool_or(whole) AS whole, bool_or(named) AS named
FROM (SELECT d.node, d.boot, d.reader_request, t.seq AS taken_seq, coalesce(t.seq >= s.seq, TRUE) AS after,
             FALSE AS unsupplied, s.whole, d.named
      FROM readers d JOIN retraction_splits s USING (node, boot)
      LEFT JOIN taken t ON t.node = d.node AND t.boot = d.boot AND t.request_id = d.reader_request
      UNION ALL
      SELECT u.node, u.boot, u.reader_request, u.taken_seq, TRUE, TRUE, coalesce(s.whole, FALSE), FALSE
      FROM unsupplied_at u LEFT JOIN retraction_splits s USING (node, boot))
GROUP BY ALL
)  -- (with the reader's facts: a reader the replay gave no pages has no exposure row to take them from)
SELECT b.*, q.tenant_id AS reader_tenant, coalesce(q.delivered, FALSE) AS reader_delivered, s.ts AS first_ts
FROM bounds b
LEFT JOIN requests q ON q.request_id = b.reader_request
LEFT JOIN records s ON s.node = b.node AND s.boot = b.boot AND s.seq = b.taken_seq;

-- (a request is named for every reader that took its pages after it was `admitted`: once its data was
-- in the pool and it had let its pages go; the pairs are counted before they are listed)
CREATE OR REPLACE TEMP TABLE admitted AS
WITH residue AS (
  SELECT node, boot, arg_max(request_id, seq) AS request_id
  FROM (SELECT w.node, w.boot, w.request_id, w.seq, unnest(range(w.lo, w.hi + 1)) AS page
        FROM page_writes w JOIN retraction_splits s USING (node, boot) WHERE w.seq < s.seq)
  GROUP BY node, boot, page
), pageless AS (  -- a request the replay gave no pages there that the logs show taking them: from its admission
  SELECT r.node, r.boot, r.request_id, min(r.seq) AS since
  FROM records r JOIN retraction_splits USING (node, boot)
  WHERE r.kind = 'request' AND r.event IN ('admitted', 'decode_started') AND r.seq IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM page_writes w
                    WHERE w.node = r.node AND w.boot = r.boot AND w.request_id = r.request_id)
  GROUP BY ALL
), in_pool AS (  -- a request's data in the pool from `since` on
  SELECT r.node, r.boot, r.request_id, s.seq AS since
  FROM residue r JOIN retraction_splits s USING (node, boot)
  UNION ALL
  SELECT w.node, w.boot, w.request_id, w.seq AS since
  FROM page_writes w JOIN retraction_splits s USING (node, boot)
  WHERE w.seq >= s.seq
  UNION ALL
  SELECT node, boot, request_id, since FROM pageless
), released AS (  -- where a request had let its pages go (one the replay gave none: at its finish)
  SELECT k.node, k.boot, k.request_id, k.seq
  FROM kv_ops k JOIN retraction_splits USING (node, boot)
  WHERE k.op = 'free'
  UNION ALL
  SELECT node, boot, request_id, seq FROM retraction_of
  UNION ALL
  SELECT r.node, r.boot, r.request_id, r.seq
  FROM records r JOIN pageless USING (node, boot, request_id)
  WHERE r.kind = 'request' AND r.event = 'finished' AND r.seq IS NOT NULL
)
SELECT p.node, p.boot, p.request_id, greatest(min(p.since), any_value(f.seq)) AS seq
FROM in_pool p
JOIN (SELECT node, boot, request_id, min(seq) AS seq FROM released GROUP BY ALL) f USING (node, boot, request_id)
GROUP BY p.node, p.boot, p.request_id;

-- name: not_ruled_out_pairs
-- (each reader's, counted without making them: the requests admitted before it by a running count
-- in the (node, boot)'s order, its own admission taken out)
WITH marks AS (
  SELECT node, boot, seq, 1 AS admitted, NULL::VARCHAR AS reader_request FROM admitted
  UNION ALL
  SELECT node, boot, taken_seq, 0, reader_request FROM retraction_bounds WHERE after AND taken_seq IS NOT NULL
), counted AS (
  SELECT node, boot, reader_request, admitted,
         sum(admitted) OVER (PARTITION BY node, boot ORDER BY seq, admitted ROWS UNBOUNDED PRECEDING) AS before
  FROM marks
)
SELECT c.node, c.boot, c.reader_request,
       (c.before - CASE WHEN EXISTS (SELECT 1 FROM retraction_bounds b JOIN admitted a
                                     ON a.node = b.node AND a.boot = b.boot AND a.request_id = b.reader_request
                                     WHERE b.node = c.node AND b.boot = c.boot AND b.reader_request = c.reader_request
                                       AND a.seq < b.taken_seq) THEN 1 ELSE 0 END)::BIGINT AS pairs
FROM counted c WHERE c.admitted = 0
ORDER BY ALL;

-- name: not_ruled_out
-- (the reader's facts are its row of retraction_bounds: a pair holds only what is its own)
SELECT b.node, b.boot, b.reader_request, a.request_id AS victim_request, q.tenant_id AS victim_tenant
FROM retraction_bounds b
JOIN admitted a ON a.node = b.node AND a.boot = b.boot AND a.seq < b.taken_seq
LEFT JOIN requests q ON q.request_id = a.request_id
WHERE b.after AND a.request_id <> b.reader_request
ORDER BY ALL;
