-- Order service example (MySQL / MariaDB). Apply after `kinbox migrate`
-- (which creates kinbox_outbox).
CREATE TABLE IF NOT EXISTS inventory (
    sku   VARBINARY(255) NOT NULL PRIMARY KEY,
    stock INT            NOT NULL,
    CONSTRAINT inventory_stock_nonneg CHECK (stock >= 0)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS orders (
    order_id   VARBINARY(255) NOT NULL PRIMARY KEY,
    user_id    BIGINT         NOT NULL,
    sku        VARBINARY(255) NOT NULL,
    qty        INT            NOT NULL,
    points     INT            NOT NULL,
    created_at TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    CONSTRAINT orders_sku_fk FOREIGN KEY (sku) REFERENCES inventory (sku)
) ENGINE = InnoDB;
