"""Mail providers behind one interface (base.py); chosen by MAIL_PROVIDER."""
