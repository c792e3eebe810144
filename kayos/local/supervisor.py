"""What ``kayos up`` does when a member of its local cluster dies: pure decisions, no processes.

``Supervisor`` is told each death (``exited``) and each start (``started``) with the time it
happened, and answers when to start the member again: after a delay that doubles with each death
in a row from ``limits.node_restart_delay_ms_min`` up to ``limits.node_restart_delay_ms_max``, or
never, once ``limits.node_restarts_max`` deaths came in a row. A member that ran for
``limits.node_restart_healthy_ms`` before it died was healthy: its count starts over. The caller
(``kayos.local.up.run_foreground``) owns the processes and the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kayos import limits


@dataclass(slots=True)
class _Member:
    started_at: float
    deaths_in_a_row: int = 0
    due_at: float | None = None


@dataclass(frozen=True, slots=True)
class Restart:
    """Start ``member`` again once ``delay_s`` passed; it is death ``attempt`` in a row."""

    member: str
    delay_s: float
    attempt: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """``member`` died ``deaths`` times in a row, each soon after its start: stop trying."""

    member: str
    deaths: int


@dataclass(slots=True)
class Supervisor:
    members: dict[str, _Member] = field(default_factory=dict)

    def started(self, member: str, now_s: float) -> None:
        """``member`` was (re)started at ``now_s``."""
        known = self.members.get(member)
        if known is None:
            self.members[member] = _Member(now_s)
        else:
            known.started_at = now_s
            known.due_at = None

    def exited(self, member: str, now_s: float) -> Restart | GiveUp:
        """``member`` was found dead at ``now_s``: when to start it again, or never."""
        known = self.members.setdefault(member, _Member(now_s))
        if (now_s - known.started_at) * 1000 >= limits.node_restart_healthy_ms:
            known.deaths_in_a_row = 0
        known.deaths_in_a_row += 1
        if known.deaths_in_a_row > limits.node_restarts_max:
            known.due_at = None
            return GiveUp(member, known.deaths_in_a_row)
        delay_ms = min(
            limits.node_restart_delay_ms_min * 2 ** (known.deaths_in_a_row - 1),
            limits.node_restart_delay_ms_max,
        )
        known.due_at = now_s + delay_ms / 1000
        return Restart(member, delay_ms / 1000, known.deaths_in_a_row)

    def due(self, now_s: float) -> list[str]:
        """Members whose restart delay has passed (each named once: ``started`` clears it)."""
        ready = [
            name
            for name, member in self.members.items()
            if member.due_at is not None and member.due_at <= now_s
        ]
        for name in ready:
            self.members[name].due_at = None
        return ready
