-- kinbox 0005: one stored form for header lists (src/hdrcodec.h). Mirrors
-- migrations/postgresql/0005_headers.sql: dead letters in the old
-- [{"name": n, "value": v}] form become [[name, value], ...], in order.
-- Rows where a \u0080..\u00ff escape stood for a raw byte, and rows over
-- 256 KB (JSON_ARRAYAGG is bounded by group_concat_max_len), keep the old
-- form; kinbox still reads it.
UPDATE kinbox_dead_letter d
SET d.headers = (
    SELECT COALESCE(JSON_ARRAYAGG(JSON_ARRAY(jt.name, jt.value) ORDER BY jt.o), '[]')
    FROM JSON_TABLE(d.headers, '$[*]' COLUMNS (
        o FOR ORDINALITY,
        name LONGTEXT PATH '$.name',
        value LONGTEXT PATH '$.value')) AS jt)
WHERE d.headers LIKE '[{%'
  AND LENGTH(d.headers) < 262144
  AND d.headers NOT REGEXP '\\\\u00[89a-fA-F][0-9a-fA-F]';
