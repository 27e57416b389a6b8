"""The operator dashboard at /admin: sign in with an admin API key; figures and charts of the last
24 hours or 7 days, newsletters with their progress, the suppression list (search, audited removal),
and the emergency stop for all outgoing mail (audited).

Modules: session (sign-in cookie + server-side session), throttle (failed sign-ins), stats (the
figures, cached), charts (matplotlib SVG), newsletters and suppressions (the tables), sending (the
emergency stop), render (templates in app/web/templates/admin, admin.css), views (the endpoints;
`routes` below maps them).
"""

from __future__ import annotations

from starlette.routing import Route

from app.web.admin import views as _views

routes = [
    Route("/admin", _views.dashboard, methods=["GET"]),
    Route("/admin/login", _views.login_page, methods=["GET"]),
    Route("/admin/login", _views.login_submit, methods=["POST"]),
    Route("/admin/logout", _views.logout, methods=["POST"]),
    Route("/admin/charts/{name:str}.svg", _views.chart, methods=["GET"]),
    Route("/admin/newsletters", _views.newsletter_list, methods=["GET"]),
    Route("/admin/suppressions", _views.suppression_list, methods=["GET"]),
    Route("/admin/suppressions/add", _views.suppression_add, methods=["POST"]),
    Route("/admin/suppressions/{id:int}/remove", _views.suppression_confirm, methods=["GET"]),
    Route("/admin/suppressions/{id:int}/remove", _views.suppression_remove, methods=["POST"]),
    Route("/admin/sending/stop", _views.sending_stop, methods=["POST"]),
    Route("/admin/sending/resume", _views.sending_resume, methods=["POST"]),
]
