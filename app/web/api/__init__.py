"""Public JSON API (/v1): events ingestion and subscriber management."""
