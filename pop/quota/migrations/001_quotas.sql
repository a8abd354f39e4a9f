-- Quotas per API key: one row per (api_key,
-- descriptor). The row with descriptor '' is the key's own: its tier and the
-- time it is in force; the other rows override the limit named descriptor.
CREATE TABLE IF NOT EXISTS quota_overrides (
    api_key           VARCHAR(64)  NOT NULL,
    descriptor        VARCHAR(256) NOT NULL,
    tier              VARCHAR(64)  NOT NULL DEFAULT '',
    requests_per_unit INT CHECK (requests_per_unit >= 0),
    unit              VARCHAR(10) CHECK (unit IN ('second', 'minute', 'hour', 'day')),
    effective_at      TIMESTAMPTZ,            -- NULL: in force since always
    expires_at        TIMESTAMPTZ,            -- NULL: never expires
    created_at        TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    PRIMARY KEY (api_key, descriptor),
    CHECK ((descriptor = '') = (requests_per_unit IS NULL AND unit IS NULL)),
    CHECK (expires_at IS NULL OR effective_at IS NULL OR expires_at > effective_at)
);
-- Listing by tier, in key order.
CREATE INDEX IF NOT EXISTS quota_overrides_tier ON quota_overrides (tier, api_key) WHERE descriptor = '';

-- The audit trail: who changed which key when, the quota before and after
-- (JSON as the admin API shows it; NULL for none). Append-only: a trigger
-- refuses updates and deletes. Its ids are also the change log PoPs follow:
-- writers take one advisory lock, so ids increase in the order they commit.
CREATE TABLE IF NOT EXISTS quota_audit (
    id      BIGSERIAL PRIMARY KEY,
    api_key VARCHAR(64) NOT NULL,
    actor   TEXT        NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    before  JSONB,
    after   JSONB
);
CREATE INDEX IF NOT EXISTS quota_audit_key ON quota_audit (api_key, id);

CREATE OR REPLACE FUNCTION quota_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'quota_audit is append-only';
END;
$$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER quota_audit_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON quota_audit
    FOR EACH STATEMENT EXECUTE FUNCTION quota_audit_append_only();
