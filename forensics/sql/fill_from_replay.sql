-- The replay's exposures where the case's page records are missing (forensics/exposure/tiers.py):
-- on the engine nodes $missing_nodes that logged requests but no page records, and inside the
-- seq-gap windows of nodes that did log page records, where those records show no exposure of
-- the same reader and victim. `replayed_exposures` is the replay case's exposures table.
-- Tier: the reader's transfer to that node carried fewer KV tokens than its prompt (by its own
-- record or the sender's) is $transfer_tier; otherwise the request records alone, $request_tier.
INSERT INTO replay_exposures BY NAME
SELECT e.* EXCLUDE (evidence),
       CASE WHEN EXISTS (
         SELECT 1 FROM transfers t JOIN requests q USING (request_id)
         WHERE t.request_id = e.reader_request AND t.dst_node = e.node AND t.event = 'completed'
           AND t.tokens_sent < q.prompt_tokens)
       THEN $transfer_tier ELSE $request_tier END AS evidence
FROM replayed_exposures e
WHERE list_contains($missing_nodes, e.node)
   OR (EXISTS (SELECT 1 FROM seq_gaps w WHERE w.node = e.node AND w.node IN (SELECT node FROM kv_ops)
                 AND e.first_ts BETWEEN w.window_start AND w.window_end)
       AND NOT EXISTS (SELECT 1 FROM exposures x WHERE x.node = e.node
                         AND x.reader_request = e.reader_request
                         AND x.victim_request = e.victim_request))
ORDER BY e.first_ts, e.node, e.reader_request, e.victim_request;
