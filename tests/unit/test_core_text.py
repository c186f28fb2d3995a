"""core/text.py: one reading of a message's text for every plane."""

from core.text import content_text


def test_strings_and_text_parts_are_text_anything_else_is_not():
    assert content_text("hi") == "hi"
    parts = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, {"type": "image_url"},
             {"type": "text", "text": {"not": "a string"}}, {"type": "tool_result", "content": "x"}, "stray"]
    assert content_text(parts) == "a b" and content_text(parts, "") == "ab" and content_text(parts, "\n") == "a\nb"
    assert content_text(None) == "" and content_text(42) == "" and content_text([]) == ""
