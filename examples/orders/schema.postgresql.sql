-- Order service example (PostgreSQL). Apply after `kinbox migrate`
-- (which creates kinbox_outbox).
CREATE TABLE IF NOT EXISTS inventory (
    sku   text    PRIMARY KEY,
    stock integer NOT NULL CHECK (stock >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
    order_id   text        PRIMARY KEY,
    user_id    bigint      NOT NULL,
    sku        text        NOT NULL REFERENCES inventory (sku),
    qty        integer     NOT NULL CHECK (qty > 0),
    points     integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
