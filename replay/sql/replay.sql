-- The replay's statements (replay/statements.py reads them by name): one per block, headed
-- `-- name:`. They run on the case's own connection (replay/scratch.py), its default catalog
-- the case and the replay's own tables in kvf_scratch.main, but for those under "the replayed
-- case", run on the replay's case with the logged case's tables as views in `kvf_logged`
-- (replay/agreement.py), and those under "the case's replays", run on the case itself.
--
-- A name in braces is a list the Python declares once, filled in when the statement is read:
-- {order} a node's order of its records (replay/statements.py), {event_values} and
-- {event_fields} a record's fields as a node's replay reads them, with and without its time in
-- microseconds, {before_transfer_end} a request's events on a node that come before its transfer
-- ends there (replay/events.py), {plan_columns} a request's plan after its id
-- (replay/planning.py). {name:t} qualifies each column of the list with the table alias t.

-- Reading the case ----------------------------------------------------------------------------

-- name: has_page_records
SELECT count(*) FROM records WHERE kind = 'kv';

-- name: configs
-- Every config record, in its node's order (seq first where a record has none).
SELECT node, boot, seq, ts, role, engine, engine_version, model, context_length, page_size, pool_pages,
       step_log_interval, file_id, line_no, doc
FROM records WHERE kind = 'config'
ORDER BY node, boot, seq NULLS FIRST, ts, file_id, line_no;

-- name: node_rows
-- The nodes that logged request or transfer records, with their records a replay reads.
SELECT node, count(*) FROM records WHERE kind IN ('request', 'transfer', 'step') GROUP BY node
HAVING count(*) FILTER (WHERE kind IN ('request', 'transfer')) > 0;

-- Planning ----------------------------------------------------------------------------------

-- name: served
-- The requests the logs show delivered: a finished with a 2xx status and none of 400 or more.
CREATE TABLE kvf_scratch.main.replay_served AS
SELECT request_id FROM records WHERE kind = 'request' AND event = 'finished' AND status IS NOT NULL
GROUP BY request_id HAVING bool_or(status BETWEEN 200 AND 299) AND NOT bool_or(status >= 400);

-- name: served_untold
-- What-if: the model decides, whatever the logs show served.
CREATE TABLE kvf_scratch.main.replay_served (request_id VARCHAR);

-- name: request_facts
-- The received requests' facts, by request id (node_roles registered): what planning needs of
-- each, its first received (in node order), its largest output logged with a 2xx answer (a
-- failure's says nothing of the steps it ran), whether a prefill or decode node logged it (the
-- first such prefill node), and whether the engine worked on it there (a prefill, a transfer, a
-- decode start or a 2xx answer, not only lines saying it arrived and was refused).
WITH ev AS (
  SELECT r.* EXCLUDE (role), coalesce(n.role, 'router') AS node_role
  FROM records r LEFT JOIN node_roles n USING (node)
  WHERE r.kind IN ('request', 'transfer') AND r.request_id IS NOT NULL
), received AS (
  SELECT request_id, ts, tenant_id, prompt_tokens, max_new_tokens, prefill_node, decode_node,
         row_number() OVER (PARTITION BY request_id ORDER BY node, {order}) AS k
  FROM ev WHERE kind = 'request' AND event = 'received'
), facts AS (
  SELECT request_id,
         max(output_tokens) FILTER (WHERE kind = 'request' AND event = 'finished'
                                    AND status BETWEEN 200 AND 299) AS output,
         bool_or(node_role = 'prefill') AS on_prefill, bool_or(node_role = 'decode') AS on_decode,
         min(node) FILTER (WHERE node_role = 'prefill') AS prefill_of,
         bool_or(node_role IN ('prefill', 'decode') AND (kind = 'transfer'
                 OR event IN ('prefill_started', 'prefill_done', 'decode_started')
                 OR (event = 'finished' AND status BETWEEN 200 AND 299))) AS engine_work,
         bool_or(node_role = 'decode' AND ((kind = 'transfer' AND event = 'completed')
                 OR event = 'decode_started' OR (event = 'finished' AND status BETWEEN 200 AND 299)))
           AS decode_work
  FROM ev GROUP BY request_id
)
SELECT r.request_id, r.ts, r.tenant_id, r.prompt_tokens, r.max_new_tokens, r.prefill_node, r.decode_node,
       f.output, coalesce(f.on_prefill, FALSE) AS on_prefill, coalesce(f.on_decode, FALSE) AS on_decode,
       f.prefill_of, coalesce(f.engine_work, FALSE) AS engine_work,
       coalesce(f.decode_work, FALSE) AS decode_work
FROM received r LEFT JOIN facts f USING (request_id) WHERE r.k = 1 ORDER BY r.request_id;

-- name: create_plans
-- The requests' plans (plan_rows: an empty Arrow table of replay/planning.py's PLAN_SCHEMA).
CREATE TABLE kvf_scratch.main.replay_plans AS SELECT * FROM plan_rows;

-- name: insert_plans
INSERT INTO kvf_scratch.main.replay_plans SELECT * FROM plan_rows;

-- Each node's records -------------------------------------------------------------------------

-- name: create_roles
-- The engine nodes' roles.
CREATE OR REPLACE TABLE kvf_scratch.main.replay_roles (node VARCHAR, role VARCHAR);

-- name: insert_role
INSERT INTO kvf_scratch.main.replay_roles VALUES (?, ?);

-- name: node_events
-- Every node's request, transfer and step records in its order (_i numbering each node's, as the
-- two statements after it number them), each with
-- its request's plan, whether the logs show it served, whether it is the request's last on the
-- node, and where it and its request's delivered finish come in the node's order. (The last and
-- the finish are aggregates joined back, not windows over every record: a window sorts them all
-- again, 2.5 s of 5.3 at 100,000 requests; the rows without a request are one group a node, as
-- a window's partition keeps them. The order is numbered, and the aggregates taken, over the
-- records' keys alone (`place`, read twice), the records' fields read once and joined to it by
-- their place in the files: with the fields in the numbered rows, read twice, DuckDB held them
-- all, and 5 million records ran out of the replay's 512 MiB now and then; now 1.2 s against 2.75
-- at 100,000 requests, 4.6 against 8.3 s at 5 million records, the same rows in the same order.)
WITH place AS (
  SELECT node, request_id, boot, kind, event, status, file_id, line_no, part,
         row_number() OVER (PARTITION BY node ORDER BY {order}) AS _i
  FROM records WHERE kind IN ('request', 'transfer', 'step')
), per_boot AS (
  SELECT node, request_id, boot, max(_i) AS _last_i,
         max(CASE WHEN kind = 'request' AND event = 'finished' AND status BETWEEN 200 AND 299
                  THEN _i END) AS _finish_i
  FROM place GROUP BY node, request_id, boot
), per_request AS (
  SELECT node, request_id, boot, _finish_i, max(_last_i) OVER (PARTITION BY node, request_id) AS _last_i
  FROM per_boot
), placed AS (
  SELECT x.file_id, x.line_no, x.part, x._i, x._i = r._last_i AS _last, r._finish_i
  FROM place x JOIN per_request r ON r.node = x.node AND r.request_id IS NOT DISTINCT FROM x.request_id
                                 AND r.boot IS NOT DISTINCT FROM x.boot
), ev AS (
  SELECT {event_values}, file_id, line_no, part FROM records WHERE kind IN ('request', 'transfer', 'step')
)
SELECT ev.node AS _node, {event_fields:ev}, s.request_id IS NOT NULL AS _served, x._last, {plan_columns:p},
       x._finish_i, x._i
FROM ev JOIN placed x USING (file_id, line_no, part)
LEFT JOIN kvf_scratch.main.replay_plans p ON p.request_id = ev.request_id
LEFT JOIN kvf_scratch.main.replay_served s ON s.request_id = ev.request_id
ORDER BY ev.node, x._i;

-- name: carried_any
-- Whether any transfer end may be carried to an engine node: one logged for its side by other nodes
-- and not by it, or implied by a decode start with no transfer end logged anywhere (carried_rows'
-- ends and more, before each node's records are numbered, which costs a sort of them all). Where
-- none is, carried_rows is made empty without that sort (SGLang's logs: each side logs its own).
SELECT EXISTS (
  SELECT 1 FROM (
    SELECT src_node, dst_node, bool_or(node = src_node) AS by_src, bool_or(node = dst_node) AS by_dst
    FROM records WHERE kind = 'transfer' AND event IN ('completed', 'failed')
    GROUP BY request_id, transfer_id, event, src_node, dst_node
  ) t
  WHERE (NOT t.by_src AND t.src_node IN (SELECT node FROM kvf_scratch.main.replay_roles WHERE role = 'prefill'))
     OR (NOT t.by_dst AND t.dst_node IN (SELECT node FROM kvf_scratch.main.replay_roles WHERE role = 'decode'))
) OR EXISTS (
  SELECT 1 FROM records r WHERE kind = 'request' AND event = 'decode_started' AND request_id IS NOT NULL
    AND request_id NOT IN (SELECT request_id FROM records WHERE kind = 'transfer' AND event IN ('completed', 'failed')
                           AND request_id IS NOT NULL)
);

-- name: carried_rows
-- For every engine node, the transfer ends it did not log itself but another node did, for its
-- side (replay/carried.py's carried_to), with the place each may go from in the node's order:
-- kept in a scratch table, read with their plans by carried_ends. (In one statement with the
-- plans' join, DuckDB held it all in memory: at 625,000 implied ends, past the replay's 512 MiB.)
CREATE OR REPLACE TABLE kvf_scratch.main.replay_carried AS
WITH node_ev AS (
  SELECT request_id, kind, event, node, row_number() OVER (PARTITION BY node ORDER BY {order}) AS _i
  FROM records WHERE kind IN ('request', 'transfer', 'step')
), mine AS (
  SELECT ev.node, ev.request_id,
         coalesce(max(ev._i) FILTER (WHERE {before_transfer_end:ev}), 0) AS _lo, n.role
  FROM node_ev ev JOIN kvf_scratch.main.replay_roles n USING (node)
  WHERE ev.request_id IS NOT NULL GROUP BY ev.node, ev.request_id, n.role
), logged_ends AS (
  SELECT n.node AS _node, {event_values:r},
         r.file_id, r.line_no, r.part, FALSE AS _implied,
         row_number() OVER (PARTITION BY n.node, r.request_id, r.transfer_id, r.event
                            ORDER BY r.node, {order:r}) AS k
  FROM records r JOIN kvf_scratch.main.replay_roles n
    ON (n.role = 'prefill' AND r.src_node = n.node) OR (n.role = 'decode' AND r.dst_node = n.node)
  WHERE r.kind = 'transfer' AND r.event IN ('completed', 'failed')
), implied AS (
  SELECT *, row_number() OVER (PARTITION BY request_id ORDER BY node, {order}) AS k_any,
         row_number() OVER (PARTITION BY request_id, node ORDER BY {order}) AS k_here
  FROM (SELECT {implied_end}
        FROM records r WHERE kind = 'request' AND event = 'decode_started' AND request_id IS NOT NULL
          AND NOT EXISTS (
            SELECT 1 FROM records x WHERE x.kind = 'transfer' AND x.event IN ('completed', 'failed')
              AND x.request_id = r.request_id))
), ends AS (
  SELECT * FROM logged_ends
  UNION ALL BY NAME
  SELECT m.node AS _node, {event_values:i},
         i.file_id, i.line_no, i.part, TRUE AS _implied,
         CASE WHEN m.role = 'prefill' THEN i.k_any ELSE i.k_here END AS k
  FROM implied i JOIN mine m ON m.request_id = i.request_id AND (m.role = 'prefill' OR m.node = i.node))
SELECT e._node, {event_fields:e}, s.request_id IS NOT NULL AS _served, m._lo, e._implied
FROM ends e JOIN mine m ON m.node = e._node AND m.request_id = e.request_id
LEFT JOIN kvf_scratch.main.replay_served s ON s.request_id = e.request_id
WHERE e.k = 1 AND NOT EXISTS (
  SELECT 1 FROM records x WHERE x.kind = 'transfer' AND x.node = e._node AND x.event = e.event
    AND x.request_id = e.request_id AND x.transfer_id IS NOT DISTINCT FROM e.transfer_id);

-- name: carried_ends
-- The carried transfer ends (carried_rows) with their requests' plans, ordered by node and then
-- by the place each may go from.
SELECT c._node, {event_fields:c}, c._served, c._lo, c._implied, {plan_columns:p}
FROM kvf_scratch.main.replay_carried c
LEFT JOIN kvf_scratch.main.replay_plans p ON p.request_id = c.request_id
ORDER BY c._node, c._lo, c.request_id, c.transfer_id, c.event;

-- name: decode_horizons
-- On decode nodes, each request's first decode start and last delivered finish where the start
-- comes first, in the node's order, with the outputs it was planned (replay/drive.py's horizons).
WITH ev AS (
  SELECT kind, event, status, request_id, boot, node,
         row_number() OVER (PARTITION BY node ORDER BY {order}) AS _i
  FROM records WHERE kind IN ('request', 'transfer', 'step')
)
SELECT ev.node, ev.boot, min(ev._i) FILTER (WHERE ev.kind = 'request' AND ev.event = 'decode_started') AS s,
       max(ev._i) FILTER (WHERE ev.kind = 'request' AND ev.event = 'finished'
                          AND ev.status BETWEEN 200 AND 299) AS f,
       any_value(coalesce(p.q_output_tokens, p.q_max_new_tokens)) AS n
FROM ev JOIN kvf_scratch.main.replay_roles r USING (node) LEFT JOIN kvf_scratch.main.replay_plans p USING (request_id)
WHERE ev.request_id IS NOT NULL AND r.role = 'decode'
GROUP BY ev.node, ev.boot, ev.request_id HAVING s < f AND n IS NOT NULL
ORDER BY ev.node, ev.boot, s;

-- name: decode_spans
-- On decode nodes, the spans (microseconds) of the requests that started and finished decoding
-- there with their output logged (replay/drive.py's cadences).
SELECT r.node, boot, min(epoch_us(ts)) FILTER (WHERE event = 'decode_started') AS s,
       max(epoch_us(ts)) FILTER (WHERE event = 'finished') AS f,
       max(output_tokens) FILTER (WHERE event = 'finished' AND status BETWEEN 200 AND 299) AS n
FROM records r JOIN kvf_scratch.main.replay_roles nr USING (node)
WHERE kind = 'request' AND request_id IS NOT NULL AND nr.role = 'decode'
GROUP BY r.node, boot, request_id HAVING s IS NOT NULL AND f IS NOT NULL AND n IS NOT NULL
ORDER BY r.node, boot, request_id;

-- name: whole_milliseconds
-- Per node, whether every one of its request times is a whole millisecond.
SELECT node, bool_and(epoch_us(ts) % 1000 = 0) FROM records WHERE kind = 'request' GROUP BY node;

-- The replayed case ---------------------------------------------------------------------------

-- name: outcomes_changed
-- Requests delivered in the logs and not in the replay, or the reverse: (request id, delivered
-- in the logs), by request id.
WITH l AS (
  SELECT request_id, coalesce(bool_or(status BETWEEN 200 AND 299) AND NOT bool_or(status >= 400), FALSE) AS ok
  FROM kvf_logged.request_events WHERE event = 'finished' GROUP BY request_id
), r AS (
  SELECT request_id, coalesce(bool_or(status BETWEEN 200 AND 299) AND NOT bool_or(status >= 400), FALSE) AS ok
  FROM request_events WHERE event = 'finished' GROUP BY request_id
)
SELECT request_id, coalesce(l.ok, FALSE) FROM l FULL JOIN r USING (request_id)
WHERE coalesce(l.ok, FALSE) <> coalesce(r.ok, FALSE) ORDER BY request_id;

-- name: allocations_reproduced
-- The logged allocations, and those the replay made page for page (the k-th of a request's on
-- its node and boot, in seq order, against the k-th).
WITH norm AS (
  SELECT src, node, boot, request_id, seq,
         list_sort(list_transform(page_ranges, lambda r: [r.lo, r.hi])) AS pages
  FROM (SELECT 'log' AS src, * FROM kvf_logged.records WHERE kind = 'kv' AND op = 'alloc'
        UNION ALL BY NAME
        SELECT 'replay' AS src, * FROM records WHERE kind = 'kv' AND op = 'alloc')
), numbered AS (
  SELECT *, row_number() OVER (PARTITION BY src, node, boot, request_id ORDER BY seq) AS k
  FROM norm
)
SELECT count(*) FILTER (WHERE l.src IS NOT NULL),
       count(*) FILTER (WHERE l.src IS NOT NULL AND l.pages = r.pages)
FROM (SELECT * FROM numbered WHERE src = 'log') l
FULL JOIN (SELECT * FROM numbered WHERE src = 'replay') r
  USING (node, boot, request_id, k);

-- name: exposure_pairs
-- The delivered exposures (reader, victim) of each case.
SELECT reader_request, victim_request, 'log' FROM kvf_logged.exposures WHERE reader_delivered
UNION ALL
SELECT reader_request, victim_request, 'replay' FROM exposures WHERE reader_delivered;

-- The case's replays --------------------------------------------------------------------------

-- name: remember_replay
INSERT OR REPLACE INTO replays (engine, what_if, out, records, not_replayed, exposure, agreement, mode,
                                outcomes_changed, disagreements, ambiguous_steps, assumed, cache_flushes)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: forget_disagreements
DELETE FROM replay_disagreements WHERE engine = ? AND what_if = ?;

-- name: remember_disagreement
INSERT INTO replay_disagreements VALUES (?, ?, ?, ?, ?, ?);
