-- The category registry (PUT /v1/categories/{key}, app/categories.py): what a category is called
-- in digests and on the preference page. A new, small table read once per batch by the digest
-- workers (cached in process), so no online-DDL care is needed.
CREATE TABLE categories (
    key         text PRIMARY KEY CHECK (key ~ '^[A-Za-z0-9._:-]{1,100}$'),
    label       text NOT NULL CHECK (length(label) BETWEEN 1 AND 100),
    description text NOT NULL DEFAULT '' CHECK (length(description) <= 500),
    verb        text NOT NULL DEFAULT '' CHECK (length(verb) <= 60),
    delivery    text NOT NULL DEFAULT 'digest' CHECK (delivery IN ('digest', 'immediate')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
