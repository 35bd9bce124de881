-- One page's history on a node: $1 node, $2-$3 boot (NULL for all), $4 page id.
-- Page records touching it, and the inferred reads that started on it at decode_started.
WITH p AS (SELECT ?::VARCHAR AS node, ?::BIGINT AS boot_filter, ?::BIGINT AS boot2, ?::BIGINT AS page)
SELECT r.boot, r.seq, r.ts, r.request_id, r.op, FALSE AS inferred, r.pages, r.source
FROM records r, p
WHERE r.kind = 'kv' AND r.node = p.node AND (p.boot_filter IS NULL OR r.boot = p.boot2)
  AND list_bool_or([x.lo <= p.page AND p.page <= x.hi FOR x IN r.page_ranges])
UNION ALL
SELECT pr.boot, pr.start_seq, t.ts, pr.request_id, 'read', TRUE, NULL, NULL
FROM page_reads pr, p
LEFT JOIN records t ON t.node = p.node AND t.boot = pr.boot AND t.seq = pr.start_seq
WHERE pr.inferred AND pr.node = p.node AND (p.boot_filter IS NULL OR pr.boot = p.boot2)
  AND pr.lo <= p.page AND p.page <= pr.hi
ORDER BY boot, seq;
