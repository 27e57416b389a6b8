"""The people we mail: their records, preferences, categories, streams, suppressions and address identity."""
