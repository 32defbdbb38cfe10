-- kinbox 0005: one stored form for header lists (src/hdrcodec.h).
-- Outbox rows already use it: [[name, value], ...]. Dead letters written
-- before used [{"name": n, "value": v}]; rewrite those in order. Rows where
-- a \u0080..\u00ff escape stood for a raw byte keep the old form (its byte
-- meaning cannot be told apart in SQL); kinbox still reads it.
UPDATE kinbox_dead_letter d
SET headers = (
    SELECT coalesce(json_agg(json_build_array(e -> 'name', e -> 'value')
                             ORDER BY o)::text, '[]')
    FROM json_array_elements(d.headers::json) WITH ORDINALITY AS t(e, o))
WHERE d.headers LIKE '[{%'
  AND d.headers !~ '\\u00[89a-fA-F][0-9a-fA-F]';
