"""The people we mail: their records (upsert, preferences, stops and restarts, erasure), suppressions,
"may we mail this address now" (mailable, the one definition), categories, mail streams, and stored
addresses brought to their canonical form (rekey)."""
