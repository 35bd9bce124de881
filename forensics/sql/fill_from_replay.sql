-- The replay's exposures where the case's page records are missing (forensics/exposure/tiers.py):
-- on the engine nodes $missing_nodes that logged requests but no page records, and inside the
-- seq-gap windows of nodes that did log page records, where those records show no exposure of
-- the same reader and victim. `replayed_exposures` is the exposures table of the replay under the
-- logged schedule; `alternative_exposures` those of the replays under the other schedules the
-- evidence allows ($schedules of them, a `schedule` column naming each), replayed on the nodes
-- $varied_nodes only (every other node replays alike under each schedule).
-- Tier: the reader's transfer to that node carried fewer KV tokens than its prompt (by its own
-- record or the sender's) is $transfer_tier; otherwise the request records alone, $request_tier.
-- Certainty: a victim is certain where every schedule names the same (reader, victim) on that
-- node, the node's replay followed its logs ($disagreeing_nodes did not; on a node whose decode
-- retracted requests, only the readers that took their pages before the first of them joined its
-- batch: `retraction_bounds`, sql/not_ruled_out.sql) and the row is not from a seq-gap window;
-- otherwise possible, and certainty_note says why. A pair named only under another schedule is
-- listed as possible with no pages (the page figures count the logged schedule's); so is each
-- request of `not_ruled_out` that no schedule names: where the node's pages are not the replay's
-- (after a retraction; on a node whose replay did not follow its logs), data the reader's pages may
-- have held on a layout the replay cannot name. A reader the replay names no victim of (it could not
-- give it its pages, `why` 'unsupplied': its transfer carried fewer pages than its prompt, so it read
-- pages it did not write; or they held nothing in the replay) has no row of its own: its pairs not
-- ruled out are its rows, where it took its pages.
INSERT INTO replay_exposures BY NAME
WITH wanted AS (
  SELECT e.*, NOT list_contains($missing_nodes, e.node) AS in_gap
  FROM (SELECT *, NULL::VARCHAR AS schedule FROM replayed_exposures
        UNION ALL BY NAME SELECT * FROM alternative_exposures) e
  WHERE list_contains($missing_nodes, e.node)
     OR (EXISTS (SELECT 1 FROM seq_gaps w WHERE w.node = e.node AND w.node IN (SELECT node FROM kv_ops)
                   AND e.first_ts BETWEEN w.window_start AND w.window_end)
         AND NOT EXISTS (SELECT 1 FROM exposures x WHERE x.node = e.node
                           AND x.reader_request = e.reader_request
                           AND x.victim_request = e.victim_request))
), named AS (  -- under how many of the other schedules each pair is named
  SELECT node, reader_request, victim_request, count(DISTINCT schedule) AS others
  FROM wanted WHERE schedule IS NOT NULL GROUP BY ALL
), base AS (
  SELECT * EXCLUDE (schedule) FROM wanted WHERE schedule IS NULL
), only_other AS (  -- pairs the logged schedule does not name: each once, as it first appears
  SELECT * EXCLUDE (schedule) FROM (
    SELECT w.*, row_number() OVER (PARTITION BY w.node, w.reader_request, w.victim_request
                                   ORDER BY w.first_ts, w.schedule, w.first_seq) AS k
    FROM wanted w WHERE w.schedule IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM base b WHERE b.node = w.node AND b.reader_request = w.reader_request
                                            AND b.victim_request = w.victim_request))
  WHERE k = 1
), reader_rows AS (  -- each reader's first row on a node (a pair not ruled out takes its place and time)
  SELECT * EXCLUDE (k) FROM (
    SELECT b.*, row_number() OVER (PARTITION BY b.node, b.reader_request
                                   ORDER BY b.first_seq, b.first_ts, b.victim_request) AS k
    FROM base b)
  WHERE k = 1
), pairs AS (  -- each pair not ruled out with its reader's facts, and why its pages are not the replay's
  SELECT c.*, CASE WHEN b.unsupplied THEN 'unsupplied' WHEN b.whole THEN 'disagreeing' ELSE 'retracted' END AS why,
         b.reader_tenant, b.reader_delivered, b.taken_seq AS first_seq, b.first_ts
  FROM not_ruled_out c
  JOIN retraction_bounds b ON b.node = c.node AND b.boot = c.boot AND b.reader_request = c.reader_request
), candidates AS (  -- requests whose data the reader's pages may have held, no schedule naming them
  SELECT r.* EXCLUDE (victim_request, victim_tenant, pages, n_pages), c.victim_request, c.victim_tenant,
         NULL::VARCHAR AS pages, 0::BIGINT AS n_pages, c.why
  FROM pairs c
  JOIN reader_rows r ON r.node = c.node AND r.boot = c.boot AND r.reader_request = c.reader_request
  WHERE NOT EXISTS (SELECT 1 FROM wanted w WHERE w.node = c.node AND w.reader_request = c.reader_request
                                            AND w.victim_request = c.victim_request)
  UNION ALL BY NAME  -- (a reader the replay names no victim of: no row to take its place and time from)
  SELECT c.reader_request, c.victim_request, c.node, c.boot, NULL::VARCHAR AS pages, 0::BIGINT AS n_pages,
         c.first_seq, c.first_ts, FALSE AS inferred, c.reader_tenant, c.victim_tenant, c.reader_delivered,
         NOT list_contains($missing_nodes, c.node) AS in_gap, c.why
  FROM pairs c
  WHERE NOT EXISTS (SELECT 1 FROM reader_rows r WHERE r.node = c.node AND r.boot = c.boot
                                                  AND r.reader_request = c.reader_request)
    AND (list_contains($missing_nodes, c.node)
         OR EXISTS (SELECT 1 FROM seq_gaps w WHERE w.node = c.node AND w.node IN (SELECT node FROM kv_ops)
                      AND c.first_ts BETWEEN w.window_start AND w.window_end))
), rows AS (
  SELECT b.*, CASE WHEN list_contains($varied_nodes, b.node) THEN coalesce(n.others, 0) ELSE $schedules END AS others,
         TRUE AS logged_schedule, FALSE AS not_ruled_out FROM base b
  LEFT JOIN named n USING (node, reader_request, victim_request)
  UNION ALL BY NAME
  SELECT o.* EXCLUDE (k, pages, n_pages), NULL::VARCHAR AS pages, 0::BIGINT AS n_pages, n.others,
         FALSE AS logged_schedule, FALSE AS not_ruled_out
  FROM only_other o JOIN named n USING (node, reader_request, victim_request)
  UNION ALL BY NAME
  SELECT c.*, $schedules AS others, FALSE AS logged_schedule, TRUE AS not_ruled_out FROM candidates c
), marked AS (  -- a reader that took its pages where or after a request the node's decode retracted joined its batch
  SELECT r.*, r.logged_schedule AND EXISTS (  -- (a pair only another schedule names is possible already)
                SELECT 1 FROM retraction_bounds f
                WHERE f.node = r.node AND f.boot = r.boot AND f.reader_request = r.reader_request AND f.after)
              AS after_retraction
  FROM rows r
)
SELECT r.* EXCLUDE (evidence, in_gap, others, logged_schedule, not_ruled_out, after_retraction, why),
       CASE WHEN EXISTS (
         SELECT 1 FROM transfers t JOIN requests q USING (request_id)
         WHERE t.request_id = r.reader_request AND t.dst_node = r.node AND t.event = 'completed'
           AND t.tokens_sent < q.prompt_tokens)
       THEN $transfer_tier ELSE $request_tier END AS evidence,
       CASE WHEN r.in_gap OR list_contains($disagreeing_nodes, r.node) OR r.after_retraction OR r.not_ruled_out
                 OR r.others + (CASE WHEN r.logged_schedule THEN 1 ELSE 0 END) < $schedules + 1
            THEN 'possible' ELSE 'certain' END AS certainty,
       CASE WHEN r.not_ruled_out AND r.why = 'unsupplied'
              THEN 'not ruled out: the replay could not give the reader its pages (replay_disagreements), and its '
                   || 'transfer carried fewer pages than its prompt: it read pages it did not write, on a layout the '
                   || 'replay cannot name; this request''s data may have been in the node''s pool then'
                   || CASE WHEN r.in_gap THEN ' (inside a seq gap: the node''s records of this window are missing)'
                           ELSE '' END
            WHEN r.in_gap THEN 'inside a seq gap: the node''s records of this window are missing'
            WHEN r.not_ruled_out AND r.why = 'disagreeing'
              THEN 'not ruled out: the replay could not follow this node''s logs everywhere (replay_disagreements), '
                   || 'so from the boot''s start its pages may not be the replay''s; this request''s data may have '
                   || 'been in the node''s pool when the reader took its pages'
            WHEN list_contains($disagreeing_nodes, r.node)
              THEN 'the replay could not follow this node''s logs everywhere (replay_disagreements)'
            WHEN r.not_ruled_out
              THEN 'not ruled out: the reader took its pages after a request the node''s decode retracted under '
                   || 'memory pressure joined its batch (replay_disagreements), where the node''s pages are not the '
                   || 'replay''s; this request''s data may have been in the node''s pool then'
            WHEN r.after_retraction
              THEN 'the reader took its pages after a request the node''s decode retracted under memory pressure '
                   || 'joined its batch, which the replay does not model (replay_disagreements)'
            WHEN NOT r.logged_schedule
              THEN 'named only under ' || r.others || ' of ' || $schedules
                   || ' other schedules the logs allow, not under the logged one'
            WHEN r.others < $schedules
              THEN 'named under the logged schedule and ' || r.others || ' of ' || $schedules
                   || ' other schedules the logs allow'
       END AS certainty_note
FROM marked r
ORDER BY r.first_ts, r.node, r.reader_request, r.victim_request, r.logged_schedule DESC;
