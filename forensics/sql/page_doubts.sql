-- Page-record exposures a seq gap leaves in doubt (forensics/exposure/tiers.py, page_rows): on a
-- (node, boot) where records are missing (seq_gaps), a reader's first sight of its victim's data is
-- proven only where no record is missing between the victim's write and that sight. Records lost
-- there may have held another request's write of those pages (the reader's own among them), a free
-- and an allocation: the victim the page records name is then only possible.
--
-- Each (reader, victim, node, boot) whose first sight (first_seq) comes after a gap that comes after
-- the victim's first write of the row's pages before that sight (its version of the pages seen then
-- is one of its writes from there on, so with no gap between the two, the sight is proven), with the
-- first such gap. (A pair is proven by any one sight: a later one after another write of the victim
-- may be, and the pair is still said possible, never the reverse.)
WITH gaps AS (
  SELECT node, boot, missing_from, missing_to FROM seq_gaps
), gapped AS (
  SELECT e.reader_request, e.victim_request, e.node, e.boot, e.pages, e.first_seq
  FROM exposures e JOIN (SELECT DISTINCT node, boot FROM gaps) USING (node, boot)
), ranges AS (  -- the row's pages, "lo" or "lo-hi" each
  SELECT reader_request, victim_request, node, boot, first_seq,
         split_part(r, '-', 1)::BIGINT AS lo,
         coalesce(nullif(split_part(r, '-', 2), ''), split_part(r, '-', 1))::BIGINT AS hi
  FROM (SELECT *, unnest(string_split(pages, ',')) AS r FROM gapped)
), written AS (
  SELECT g.reader_request, g.victim_request, g.node, g.boot, any_value(g.first_seq) AS first_seq,
         min(w.seq) AS seq
  FROM ranges g
  JOIN page_writes w ON w.node = g.node AND w.boot = g.boot AND w.request_id = g.victim_request
   AND w.lo <= g.hi AND w.hi >= g.lo AND w.seq < g.first_seq
  GROUP BY g.reader_request, g.victim_request, g.node, g.boot
)
SELECT w.reader_request, w.victim_request, w.node, w.boot,
       min(g.missing_from) AS missing_from, arg_min(g.missing_to, g.missing_from) AS missing_to
FROM written w
JOIN gaps g ON g.node = w.node AND g.boot = w.boot AND g.missing_from > w.seq AND g.missing_to < w.first_seq
GROUP BY w.reader_request, w.victim_request, w.node, w.boot
