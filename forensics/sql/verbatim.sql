-- The text of the lines in wanted_lines (file_id, line_no), as read: from source_lines
-- (wanted_texts, forensics/ingestion/source.py), or for a file without lines (Parquet) the JSON made of
-- its row (records and duplicates keep it as doc, quarantine as raw).
WITH wanted AS (
  SELECT DISTINCT file_id, line_no FROM wanted_lines
), made AS (
  SELECT file_id, line_no, any_value(text) AS text FROM (
    SELECT file_id, line_no, doc AS text FROM records WHERE doc IS NOT NULL
    UNION ALL SELECT file_id, line_no, doc FROM duplicates WHERE doc IS NOT NULL
    UNION ALL SELECT file_id, line_no, raw FROM quarantine
  ) SEMI JOIN wanted USING (file_id, line_no)
  GROUP BY ALL
)
SELECT w.file_id, w.line_no, f.path, coalesce(t.text, m.text) AS text
FROM wanted w
JOIN files f USING (file_id)
LEFT JOIN wanted_texts t USING (file_id, line_no)
LEFT JOIN made m USING (file_id, line_no)
ORDER BY w.file_id, w.line_no
