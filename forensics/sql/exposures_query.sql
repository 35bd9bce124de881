-- Exposure rows with optional filters, bound as parameters:
-- $1-$3 tenant (reader's or victim's), $4-$5 reader request, $6-$7 victim request,
-- $8 delivered responses only.
SELECT reader_request, reader_tenant, victim_request, victim_tenant, node, boot, pages, n_pages,
       first_seq, first_ts, inferred, reader_delivered, evidence
FROM exposures
WHERE (?::VARCHAR IS NULL OR reader_tenant = ?::VARCHAR OR victim_tenant = ?::VARCHAR)
  AND (?::VARCHAR IS NULL OR reader_request = ?::VARCHAR)
  AND (?::VARCHAR IS NULL OR victim_request = ?::VARCHAR)
  AND (NOT ?::BOOLEAN OR reader_delivered)
ORDER BY first_ts, node, boot, first_seq, reader_request, victim_request;
