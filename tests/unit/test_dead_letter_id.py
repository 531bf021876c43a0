"""Dead-lettered messages are named by their message id, or by their body when they have none."""

from service.adapters.dead_letters import dead_letter_id


def test_message_id_names_the_message() -> None:
    assert dead_letter_id("0190b1c2d3e4f5a6b7c8d9e0f1a2b3c4", b"{}") == "0190b1c2d3e4f5a6b7c8d9e0f1a2b3c4"


def test_a_message_without_id_is_named_by_its_body() -> None:
    named = dead_letter_id(None, b"\x00poison")
    assert named.startswith("sha256:") and len(named) == len("sha256:") + 16
    assert dead_letter_id("", b"\x00poison") == named != dead_letter_id(None, b"other")
