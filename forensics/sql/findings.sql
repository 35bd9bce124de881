-- Findings (forensics/findings.py): one query per finding, headed by its name, severity, title
-- and partition. The partition says what each evidence row depends on, so that the Spark path
-- (forensics/spark/findings.py) runs the query unchanged on a part of the case at a time:
-- node (the records of one node, its exposures and uninitialized reads), request (the records
-- of the requests a row names, the transfer records sharing their transfers' ids, every config,
-- and those requests' rows of requests), transfer (the transfer records of one transfer id), or
-- case (the whole case, for queries of small tables). A finding of partition parts sums the rows
-- of its parts, the blocks named ID/part that follow it, each of a partition of its own: they are
-- the rows of a table parts, which its query reads (on DuckDB, WITH parts AS (part UNION ALL ...)).

-- name: config.context_exceeds_pool
-- severity: high
-- partition: case
-- title: the context window exceeds what the prefill KV pool admits on {count} node config(s)
-- A prefill node whose context_length is more than its max_req_input_len admits: prompts in
-- the window [at_risk_from, at_risk_to] pass the router and are rejected (or worse) on prefill
-- (SGLang's validate_input_length rejects a prompt of max_req_input_len tokens or more).
SELECT c.node, c.boot, c.seq, c.ts, c.context_length, c.pool_tokens, c.max_req_input_len,
       c.max_req_input_len AS at_risk_from, c.context_length - 1 AS at_risk_to,
       (SELECT count(*) FROM request_events r WHERE r.event = 'received'
          AND r.prompt_tokens BETWEEN c.max_req_input_len AND c.context_length - 1) AS prompts_in_window
FROM configs c WHERE c.context_exceeds_pool
ORDER BY node, boot, seq;

-- name: handoff.rejected_but_transferred
-- severity: critical
-- partition: request
-- title: {count} request(s) rejected on a prefill node still had a transfer, a decode start or a delivered response
WITH rejected AS (
  SELECT r.request_id, any_value(r.node ORDER BY r.ts) AS prefill_node, min(r.ts) AS rejected_at,
         any_value(r.reason ORDER BY r.ts) AS reason, any_value(r.limit_tokens ORDER BY r.ts) AS limit_tokens
  FROM request_events r
  WHERE r.event = 'rejected' AND r.node IN (SELECT node FROM configs WHERE role = 'prefill')
  GROUP BY r.request_id
)
SELECT j.request_id, j.prefill_node, j.rejected_at, j.reason, j.limit_tokens, q.prompt_tokens,
       (SELECT count(*) FROM transfers t WHERE t.request_id = j.request_id AND t.event = 'completed') AS transfers_completed,
       (SELECT min(t.tokens) FROM transfers t WHERE t.request_id = j.request_id AND t.event = 'completed') AS tokens_sent,
       (SELECT count(*) FROM request_events e WHERE e.request_id = j.request_id AND e.event = 'decode_started') AS decode_starts,
       q.status, q.delivered
FROM rejected j LEFT JOIN requests q USING (request_id)
WHERE transfers_completed > 0 OR decode_starts > 0 OR coalesce(q.delivered, FALSE)
ORDER BY rejected_at, request_id;

-- name: integrity.engine_caught_corruption
-- severity: critical
-- partition: request
-- title: {count} request(s) the engine itself caught receiving another handoff's metadata or KV (bootstrap_room or KV checksum mismatch)
-- SGLang's own integrity checks on decode (0.5.9 on: bootstrap_room; 0.5.21 on, with
-- --disaggregation-enable-kv-checksum: a checksum of the KV received). The request was aborted
-- (HTTP 500), so its response carried nothing stale; the handoff that failed the check is the
-- evidence that pages or metadata crossed between requests.
SELECT e.request_id, e.node, e.ts, e.finish_reason, e.status, q.tenant_id, q.prompt_tokens, e.file_id, e.line_no
FROM request_events e LEFT JOIN requests q USING (request_id)
WHERE e.event = 'finished' AND e.finish_reason IN ('bootstrap_room_mismatch', 'kv_checksum_mismatch')
ORDER BY e.ts, e.request_id;

-- name: handoff.coverage_mismatch
-- severity: high
-- partition: request
-- title: {count} transfer(s) carried fewer KV tokens than the prompt, and decode went on to read
-- The tokens are the view's tokens_sent: the receiving side's, or the sender's record of the same
-- transfer. Order is by seq on the node, or by time where the records have no seq (engine logs).
SELECT t.transfer_id, t.request_id, t.node, t.seq, t.ts, t.src_node, t.dst_node, t.tokens_sent AS tokens,
       q.prompt_tokens, q.prompt_tokens - t.tokens_sent AS tokens_missing
FROM transfers t JOIN requests q USING (request_id)
WHERE t.event = 'completed' AND t.node = t.dst_node AND t.tokens_sent < q.prompt_tokens
  AND (EXISTS (SELECT 1 FROM request_events e WHERE e.request_id = t.request_id AND e.node = t.dst_node
                 AND e.event = 'decode_started' AND e.boot = t.boot
                 AND (e.seq > t.seq OR ((e.seq IS NULL OR t.seq IS NULL) AND e.ts >= t.ts)))
       OR EXISTS (SELECT 1 FROM kv_ops k WHERE k.request_id = t.request_id AND k.node = t.dst_node
                 AND k.op = 'read' AND k.boot = t.boot AND k.seq > t.seq))
ORDER BY t.ts, t.transfer_id;

-- name: response.delivered_after_reject
-- severity: critical
-- partition: request
-- title: {count} request(s) were rejected and still answered with a 2xx response
SELECT q.request_id, q.tenant_id, q.prompt_tokens, q.status, q.first_ts, q.last_ts,
       (SELECT string_agg(DISTINCT e.node, ',' ORDER BY e.node) FROM request_events e
         WHERE e.request_id = q.request_id AND e.event = 'rejected') AS rejected_on
FROM requests q WHERE q.rejected AND q.delivered
ORDER BY q.first_ts, q.request_id;

-- name: kv.late_write
-- severity: high
-- partition: boot
-- title: {count} write(s) landed on pages their writer had already freed
WITH w AS (
  SELECT node, boot, seq, ts, request_id, pages, source, unnest(page_ranges) AS g FROM kv_ops WHERE op = 'write'
), late AS (
  SELECT DISTINCT w.node, w.boot, w.seq, w.ts, w.request_id, w.pages, w.source
  FROM w JOIN (SELECT node, boot, seq, request_id, unnest(page_ranges) AS g FROM kv_ops WHERE op = 'free') f
    ON f.node = w.node AND f.boot = w.boot AND f.request_id = w.request_id AND f.seq < w.seq
   AND f.g.lo <= w.g.hi AND w.g.lo <= f.g.hi
  WHERE NOT EXISTS (
    SELECT 1 FROM (SELECT node, boot, seq, request_id, unnest(page_ranges) AS g FROM kv_ops
                   WHERE op IN ('alloc', 'share')) a
    WHERE a.node = w.node AND a.boot = w.boot AND a.request_id = w.request_id
      AND a.seq > f.seq AND a.seq < w.seq AND a.g.lo <= w.g.hi AND w.g.lo <= a.g.hi)
)
SELECT l.*, (SELECT count(DISTINCT e.reader_request) FROM exposures e
               WHERE e.victim_request = l.request_id AND e.node = l.node AND e.boot = l.boot
                 AND e.first_seq >= l.seq) AS tainted_readers
FROM late l ORDER BY l.ts, l.node, l.seq;

-- name: kv.uninitialized_read
-- severity: medium
-- partition: boot
-- title: {count} request(s) read pages never written in the boot
SELECT request_id, node, boot, count(*) AS ranges, sum(hi - lo + 1)::BIGINT AS pages, min(seq) AS first_seq,
       bool_or(inferred) AS inferred
FROM uninitialized_reads GROUP BY ALL ORDER BY node, boot, first_seq, request_id;

-- name: evidence.seq_gap
-- severity: medium
-- partition: boot
-- title: {count} gap(s) in nodes' seq: records are missing there, and so is their evidence
SELECT * FROM seq_gaps ORDER BY node, boot, missing_from;

-- name: evidence.clock_skew
-- severity: low
-- partition: parts
-- title: {count} sign(s) of clock skew: transfers completing before they started, or ts running backwards in seq order
-- The signs each part below finds (the rows of `parts`: a part per transfer, a part per boot of a node)
-- summed per link and per node.
SELECT signal, node_a, node_b, n, min_seconds, max_seconds,
       CASE signal WHEN 'transfer' THEN 'node_b''s clock is behind node_a''s by at least ' || round(-min_seconds, 6) || ' s'
            ELSE 'node_a''s ts went back by up to ' || round(-min_seconds, 6) || ' s between consecutive seq' END AS bound
FROM (SELECT signal, node_a, node_b, sum(n)::BIGINT AS n, min(min_seconds) AS min_seconds,
             max(max_seconds) AS max_seconds
      FROM parts GROUP BY signal, node_a, node_b HAVING min(min_seconds) < 0)
ORDER BY signal, node_a, node_b;

-- name: evidence.clock_skew/part
-- partition: transfer
-- A transfer's sending side's start and its receiving side's completion: the time between them,
-- per link (node_a sends, node_b receives).
SELECT 'transfer' AS signal, s.src_node AS node_a, c.dst_node AS node_b, count(*) AS n,
       min(epoch_us(c.ts) - epoch_us(s.ts)) / 1e6 AS min_seconds, max(epoch_us(c.ts) - epoch_us(s.ts)) / 1e6 AS max_seconds
FROM transfers s JOIN transfers c
  ON c.transfer_id = s.transfer_id AND s.event = 'started' AND s.node = s.src_node
 AND c.event = 'completed' AND c.node = c.dst_node
GROUP BY ALL;

-- name: evidence.clock_skew/part
-- partition: boot
-- A node's ts going back between consecutive seq of a boot.
SELECT 'ts_before_previous_seq' AS signal, node AS node_a, NULL::VARCHAR AS node_b, count(*) AS n,
       min(step_us) / 1e6 AS min_seconds, max(step_us) / 1e6 AS max_seconds
FROM (SELECT node, epoch_us(ts) - epoch_us(lag(ts) OVER (PARTITION BY node, boot ORDER BY seq)) AS step_us
      FROM records WHERE seq IS NOT NULL)
WHERE step_us < 0 GROUP BY ALL;

-- name: evidence.role_unknown
-- severity: high
-- partition: case
-- title: {count} engine log file(s) say nothing of their server's role: read as unified servers
-- A prefill or decode server's role comes from its server_args line or its time stats; a file
-- with neither (a request-log file with no server log beside it) was read as a unified server,
-- whose finishes are the client's answers. Ingest it again with --role prefill or --role decode.
SELECT f.path, f.adapter, n.text
FROM file_notes n JOIN files f USING (file_id)
WHERE n.key = 'role'
ORDER BY f.path;

-- name: evidence.unknown_tenant
-- severity: medium
-- partition: request
-- title: {count} request(s) have no known tenant: tenant figures cannot tell them apart
-- Engine logs do not carry tenants; ingest with --tenant-map or --tenant-from to name them.
SELECT request_id, prompt_tokens, status, delivered, first_ts
FROM requests WHERE tenant_id = 'unknown'
ORDER BY first_ts, request_id;

-- name: evidence.request_ids_differ
-- severity: high
-- partition: transfer
-- title: {count} transfer(s) are logged under different request ids by their two sides: the sides are not tied
-- The prefill and decode servers logged the same transfer (for SGLang, its bootstrap room) under
-- different request ids, as servers that each assign their own rid do (no rid from the client or
-- the router). Requests are tied across nodes by request id, so each side is read as a request of
-- its own: the handoff, its findings and the replay cannot follow them. Ingest the SGLang logs
-- again with --request-ids room.
SELECT transfer_id, list(DISTINCT request_id ORDER BY request_id) AS request_ids,
       list(DISTINCT node ORDER BY node) AS nodes
FROM transfer_records
GROUP BY transfer_id
HAVING count(DISTINCT request_id) > 1
ORDER BY transfer_id;

-- name: evidence.request_id_conflict
-- severity: high
-- partition: case
-- title: {count} request id(s) were received for two tenants or two prompt lengths: the others are quarantined, and the exposures of these ids are in doubt
-- Two received records of one request id named other tenants or prompt lengths: two requests
-- that cannot be told apart. The one whose canonical JSON sorts first is kept (with those that
-- agree with it) and the others are quarantined as conflicts (log-schema.md section 4), so every
-- figure counts the id once, for the kept tenant; what the id's records say (its pages, its
-- exposures, as reader or victim) may be the other request's. Each row: the id, the claim kept,
-- the claims quarantined, and how many records made them.
SELECT request_id, min(kept_tenant_id) AS kept_tenant_id, min(kept_prompt_tokens) AS kept_prompt_tokens,
       list(DISTINCT tenant_id ORDER BY tenant_id) AS quarantined_tenant_ids,
       list(DISTINCT prompt_tokens ORDER BY prompt_tokens) AS quarantined_prompt_tokens,
       count(*) AS quarantined_records
FROM received_conflicts
GROUP BY request_id
ORDER BY request_id;

-- name: evidence.access_status_differs
-- severity: high
-- partition: case
-- title: {count} engine log file(s) answered clients with other HTTP statuses than their finish lines say
-- An SGLang server's uvicorn access lines give the status each generate request's client got;
-- its finish lines (and the tokenizer's context rejections, a 400 each) say how the requests
-- ended. Counted status by status per file, they differ: a response the logs call delivered may
-- not have reached its client, or one they call failed may have. The access lines name no
-- request, so they are compared as counts; the text gives both.
SELECT f.path, f.adapter, n.text
FROM file_notes n JOIN files f USING (file_id)
WHERE n.key = 'access'
ORDER BY f.path;

-- name: handoff.sent_but_not_received
-- severity: high
-- partition: transfer
-- title: {count} transfer(s) completed on the sending side but failed on the receiving side: possible late writes
-- The prefill side logged its transfer completed (it sent the KV) while the decode side gave
-- up on it (its transfer failed, as a timeout does) and freed the pages it had reserved. If the
-- writes landed after that, they overwrote pages decode may already have given to another
-- request: a late write. Page records show one (kv.late_write); request-level logs cannot, so a
-- replay of them does not see what such writes overwrote: each transfer here is a gap in the
-- evidence its figures rest on.
SELECT s.transfer_id, s.request_id, s.node AS src_node, s.ts AS sent_at, r.node AS dst_node,
       r.ts AS failed_at
FROM transfers s
JOIN transfers r ON r.transfer_id = s.transfer_id AND r.event = 'failed' AND r.node = r.dst_node
WHERE s.event = 'completed' AND s.node = s.src_node
ORDER BY sent_at, transfer_id;
