"""Operations: the changes that span domains, one function each, called alike by the web routes and
pages, the commands and the workers. Each owns its transaction and, for an operator's change, its
audit row (audit.py, the one writer of `admin_audit`); each domain offers its own step (its tables
only) and the operation composes them in the order their locks need. Entry points hold no write SQL."""
