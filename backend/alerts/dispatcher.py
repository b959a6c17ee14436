"""The thread each API process runs: every ``CONSPO_ALERT_POLL_S``, fire what is due and send
what is due. A pass that fails (the database away) is logged and tried again next time."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import exists, select

from backend.alerts import delivery, rules
from backend.config import Settings
from backend.db import Database
from backend.models import AlertFiring, AlertRule

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self.sender = delivery.Sender(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="alert-dispatcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.settings.alert_timeout_s + 5)

    def run_once(self) -> None:
        with self.db.session() as session:
            # Most platforms hold no rule: one cheap read, then nothing.
            if not session.scalar(select(exists().where(AlertRule.id.is_not(None)))):
                return
            rules.fire_due(session)
            if session.scalar(
                select(exists().where(AlertFiring.state.in_(("pending", "sending"))))
            ):
                self.sender.deliver_due(session)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.alert_poll_s):
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.warning(
                    "alert pass failed; trying again in %ss",
                    self.settings.alert_poll_s,
                    exc_info=True,
                )
