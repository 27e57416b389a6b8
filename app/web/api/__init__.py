"""The public JSON API (/v1): events, subscribers, categories, newsletters, and the in-app feed, server
side (feed) and in the browser with feed tokens (feed_browser). Declared with
app/platform/openapi.py's api_route: each route is documented in /openapi.json."""
