"""Token ids to text as a request's tokens come (serve stage): the text so far through the
tokenizer, the part safe to send now (a partial UTF-8 character, or what may be the start of
a stop string, is held back), and where a stop string ends it (the stop string itself is not
part of the answer, as OpenAI's API does). Without a tokenizer there is no text."""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text, self.sent, self.stopped = "", 0, False
        self.hold = max((len(s) - 1 for s in stops), default=0)

    def add(self, token: int) -> str | None:
        """Take one token; the stop string it completes, if any (the text ends before it)."""
        self.ids.append(token)
        if self.tokenizer is None or self.stopped:
            return None
        self.text = self.tokenizer.decode(self.ids)
        hits = [(i, s) for s in self.stops
                if (i := self.text.find(s, max(0, self.sent - len(s)))) >= 0]
        if not hits:
            return None
        at, stop = min(hits)
        self.text, self.stopped = self.text[:at], True
        return stop

    def take(self) -> str:
        """The text not sent yet that is safe to send now."""
        end = len(self.text)
        if not self.stopped:
            while end > self.sent and self.text[end - 1] == "\ufffd":   # a partial character
                end -= 1
            end = max(self.sent, end - self.hold)
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def finish_delta(self) -> str:
        """At the end: everything not sent yet."""
        out, self.sent = self.text[self.sent:], len(self.text)
        return out

    def finish(self) -> str:
        """At the end: the whole text."""
        return self.text
