"""Development provider: each mail becomes an .eml file in MAIL_FILE_DIR.

The file is named after the idempotency key, so a re-send of the same mail replaces its file
instead of adding a second one (what an ESP honouring idempotency keys would do).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from app.platform import config, mail
from app.platform.providers.base import STOPPED, OutgoingMail, Progress, Provider, SendResult, TransientError

log = logging.getLogger("app.platform.providers.file")


def _file_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", key)[:150] + ".eml"


class FileProvider(Provider):
    name = "file"
    max_batch = 1000
    preferred_batch = 100

    def __init__(self, directory: str | None = None):
        self.directory = Path(directory or config.get().mail_file_dir)

    def prepare(self, m: OutgoingMail) -> bytes:
        return mail.build(m)

    def deliver(self, prepared: list[tuple[OutgoingMail, bytes]], progress: Progress) -> list[SendResult]:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TransientError(f"cannot create {self.directory}: {exc}") from exc
        results: list[SendResult] = []
        for m, raw in prepared:
            progress.poll()
            result = STOPPED if progress.stop_requested() else self._write(m, raw)
            progress.add(len(results), result)
            results.append(result)
        return results

    def _write(self, m: OutgoingMail, raw: bytes) -> SendResult:
        path = self.directory / _file_name(m.idempotency_key)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(raw)
            os.replace(tmp, path)  # readers never see half a file
        except OSError as exc:
            return SendResult(ok=False, error=f"write {path}: {exc}")
        log.info("wrote %s to %s", m.idempotency_key, path)
        return SendResult(ok=True, message_id=mail.message_id_of(m))
