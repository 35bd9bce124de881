-- Exposure rows with optional filters, bound as parameters: $tenant (reader's or victim's),
-- $request (reader), $victim, $delivered_only; with the rows the replay filled in where page
-- records are missing (replay_exposures, spliced in from tiers.replay_rows) unless $page_records_only.
-- The page records' rows are spliced in from tiers.page_rows. A row's victim is certain
-- on page records but across a seq gap, and on the replay where every schedule the evidence allows
-- names it (certainty_note: why a victim is only possible).
SELECT reader_request, reader_tenant, victim_request, victim_tenant, node, boot, pages, n_pages,
       first_seq, first_ts, inferred, reader_delivered, evidence, certainty, certainty_note
FROM ({page_rows}
      UNION ALL BY NAME
      SELECT * FROM ({replay_rows}) WHERE NOT $page_records_only::BOOLEAN)
WHERE ($tenant::VARCHAR IS NULL OR reader_tenant = $tenant::VARCHAR OR victim_tenant = $tenant::VARCHAR)
  AND ($request::VARCHAR IS NULL OR reader_request = $request::VARCHAR)
  AND ($victim::VARCHAR IS NULL OR victim_request = $victim::VARCHAR)
  AND (NOT $delivered_only::BOOLEAN OR reader_delivered)
ORDER BY first_ts, node, boot, first_seq, reader_request, victim_request;
