from __future__ import annotations

from dataclasses import dataclass

import pytest

from duplex_gateway.errors import ErrorCode, ProtocolError
from duplex_gateway.resume import Journal, ResumeRegistry, new_resume_token


def test_journal_replays_after_a_sequence_number() -> None:
    journal = Journal(max_events=10, max_bytes=1000)
    for seq in range(1, 6):
        journal.append(seq, f"e{seq}")
    assert journal.after(3) == ["e4", "e5"]
    assert journal.after(5) == []
    assert journal.can_replay_after(0)


def test_journal_is_bounded_by_count_and_bytes() -> None:
    journal = Journal(max_events=3, max_bytes=1000)
    for seq in range(1, 6):
        journal.append(seq, "x")
    assert journal.after(0) == ["x", "x", "x"]
    assert not journal.can_replay_after(1) and journal.can_replay_after(2)
    by_bytes = Journal(max_events=100, max_bytes=10)
    for seq in range(1, 5):
        by_bytes.append(seq, "12345")
    assert len(by_bytes.after(0)) == 2 and not by_bytes.can_replay_after(1)


@dataclass
class Parked:
    session_id: str
    resume_token: str
    oldest: int = 0

    def can_replay_after(self, seq: int) -> bool:
        return seq >= self.oldest


def test_registry_claims_once_with_the_right_token() -> None:
    registry: ResumeRegistry[Parked] = ResumeRegistry()
    session = Parked("s1", new_resume_token())
    registry.park(session)
    with pytest.raises(ProtocolError) as wrong:
        registry.claim("s1", "forged", 0)
    assert wrong.value.code is ErrorCode.INVALID_RESUME_TOKEN
    assert registry.claim("s1", session.resume_token, 0) is session
    with pytest.raises(ProtocolError):
        registry.claim("s1", session.resume_token, 0)


def test_registry_refuses_a_gap() -> None:
    registry: ResumeRegistry[Parked] = ResumeRegistry()
    session = Parked("s1", "tok", oldest=10)
    registry.park(session)
    with pytest.raises(ProtocolError) as gap:
        registry.claim("s1", "tok", 3)
    assert gap.value.code is ErrorCode.RESUME_GAP
    registry.unpark(session)
    assert registry.parked() == []


def test_tokens_are_unique() -> None:
    assert len({new_resume_token() for _ in range(100)}) == 100
