from __future__ import annotations

from dataclasses import dataclass

import pytest

from duplex_gateway.host.resumption import Journal, ResumeRegistry, new_resume_token, new_session_id, node_of
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError


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


def test_event_ack_trims_the_journal() -> None:
    journal = Journal(max_events=10, max_bytes=1000)
    for seq in range(1, 6):
        journal.append(seq, f"e{seq}")
    journal.acknowledge(3)
    # Acknowledged events are gone (a resume from them is a gap), the rest are kept.
    assert journal.after(0) == ["e4", "e5"]
    assert journal.can_replay_after(3) and not journal.can_replay_after(2)
    journal.acknowledge(5)
    assert journal.after(0) == [] and journal.can_replay_after(5)
    # An ack may repeat or lag behind; it never brings anything back.
    journal.acknowledge(1)
    assert journal.can_replay_after(5) and not journal.can_replay_after(4)


def test_the_registry_says_which_sessions_it_holds() -> None:
    registry: ResumeRegistry[Parked] = ResumeRegistry()
    attached, parked = Parked("sess_a", "t"), Parked("sess_b", "t")
    registry.attach(attached)
    registry.park(parked)
    assert registry.holds("sess_a") and registry.holds("sess_b") and not registry.holds("sess_c")
    registry.unpark(parked)
    assert not registry.holds("sess_b")


def test_a_journal_carried_on_goes_on_from_the_sessions_head() -> None:
    journal = Journal(max_events=16, max_bytes=1 << 16)
    journal.carry_on([(8, "e8"), (9, "e9")], head=9)
    assert journal.head == 9 and journal.entries() == [(8, "e8"), (9, "e9")]
    assert journal.can_replay_after(7) and not journal.can_replay_after(6)
    journal.acknowledge(9)  # the client has the last event the other gateway sent
    journal.append(10, "e10")
    assert journal.after(9) == ["e10"]
    empty = Journal(max_events=16, max_bytes=1 << 16)
    empty.carry_on([], head=5)
    assert empty.head == 5 and empty.can_replay_after(5) and not empty.can_replay_after(4)


def test_an_ack_of_an_event_never_sent_is_refused() -> None:
    journal = Journal(max_events=10, max_bytes=1000)
    journal.append(1, "e1")
    with pytest.raises(ProtocolError) as ahead:
        journal.acknowledge(2)
    assert ahead.value.code is ErrorCode.INVALID_VALUE and ahead.value.param == "server_event_seq"
    assert journal.after(0) == ["e1"]


def test_an_attached_session_can_be_claimed_for_a_takeover() -> None:
    # Its client lost a connection the gateway has not noticed: the resume must still succeed.
    registry: ResumeRegistry[Parked] = ResumeRegistry()
    session = Parked("s1", "tok")
    registry.attach(session)
    assert registry.parked() == []
    with pytest.raises(ProtocolError):
        registry.claim("s1", "forged", 0)
    assert registry.claim("s1", "tok", 0) is session
    with pytest.raises(ProtocolError):
        registry.claim("s1", "tok", 0)  # one claim per attach: a second socket cannot race in


def test_parking_and_reattaching_move_a_session_and_unpark_forgets_it() -> None:
    registry: ResumeRegistry[Parked] = ResumeRegistry()
    session = Parked("s1", "tok")
    registry.attach(session)
    registry.park(session)
    assert registry.parked() == [session]
    registry.attach(session)
    assert registry.parked() == []
    registry.unpark(session)  # the session ended
    with pytest.raises(ProtocolError) as gone:
        registry.claim("s1", "tok", 0)
    assert gone.value.code is ErrorCode.INVALID_RESUME_TOKEN


def test_a_gap_leaves_an_attached_session_where_it_was() -> None:
    registry: ResumeRegistry[Parked] = ResumeRegistry()
    session = Parked("s1", "tok", oldest=10)
    registry.attach(session)
    with pytest.raises(ProtocolError) as gap:
        registry.claim("s1", "tok", 3)
    assert gap.value.code is ErrorCode.RESUME_GAP
    assert registry.claim("s1", "tok", 10) is session


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


def test_session_ids_name_their_node() -> None:
    plain, tagged = new_session_id(), new_session_id("gw-1")
    assert plain.startswith("sess_") and node_of(plain) is None
    assert tagged.startswith("sess_gw-1_") and node_of(tagged) == "gw-1"
    assert len({new_session_id("gw-1") for _ in range(100)}) == 100
    assert node_of("sess_gw1_nothex") is None and node_of("other") is None


def test_a_resume_for_another_node_says_where_it_belongs() -> None:
    registry: ResumeRegistry[Parked] = ResumeRegistry("gw1")
    with pytest.raises(ProtocolError) as elsewhere:
        registry.claim(new_session_id("gw2"), "tok", 0)
    assert elsewhere.value.code is ErrorCode.INVALID_RESUME_TOKEN
    assert "'gw2'" in elsewhere.value.message and "gw1" in elsewhere.value.message
    # Its own node's ids, and untagged ids, get the plain refusal.
    for session_id in (new_session_id("gw1"), new_session_id()):
        with pytest.raises(ProtocolError) as plain:
            registry.claim(session_id, "tok", 0)
        assert "node" not in plain.value.message
