"""Token ids to text as a request's tokens come (serve stage): the text so far through the
tokenizer, decoded incrementally (each token decodes a short window of ids, the tokens since
the last complete piece of text, as TGI and vLLM do, not the whole answer again), the part
safe to send now (a partial UTF-8 character, or what may be the start of
a stop string, is held back), and where a stop string ends it (the stop string itself is not
part of the answer, as OpenAI's API does). Without a tokenizer there is no text."""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text, self.sent, self.stopped = "", 0, False
        self.prefix_at = self.read_at = 0     # the window: ids[prefix_at:] decodes the tail
        self.hold = max((len(s) - 1 for s in stops), default=0)

    def add(self, token: int) -> str | None:
        """Take one token; the stop string it completes, if any (the text ends before it)."""
        self.ids.append(token)
        if self.tokenizer is None or self.stopped:
            return None
        self.text += self._tail()
        hits = [(i, s) for s in self.stops
                if (i := self.text.find(s, max(0, self.sent - len(s)))) >= 0]
        if not hits:
            return None
        at, stop = min(hits)
        self.text, self.stopped = self.text[:at], True
        return stop

    def _tail(self) -> str:
        """The text the newest ids add: ids[prefix_at:] decoded, less what ids[prefix_at:
        read_at] decoded to; nothing while it ends in a partial character."""
        before = self.tokenizer.decode(self.ids[self.prefix_at:self.read_at])
        after = self.tokenizer.decode(self.ids[self.prefix_at:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix_at, self.read_at = self.read_at, len(self.ids)
        return after[len(before):]

    def take(self) -> str:
        """The text not sent yet that is safe to send now."""
        end = len(self.text)
        if not self.stopped:
            while end > self.sent and self.text[end - 1] == "\ufffd":   # a partial character
                end -= 1
            end = max(self.sent, end - self.hold)
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def _flush(self) -> None:
        """At the end: what the last ids add, a partial character included."""
        if self.tokenizer is not None and not self.stopped and self.read_at < len(self.ids):
            before = self.tokenizer.decode(self.ids[self.prefix_at:self.read_at])
            after = self.tokenizer.decode(self.ids[self.prefix_at:])
            self.text += after[len(before):] if after.startswith(before) else ""
            self.prefix_at = self.read_at = len(self.ids)

    def finish_delta(self) -> str:
        """At the end: everything not sent yet."""
        self._flush()
        out, self.sent = self.text[self.sent:], len(self.text)
        return out

    def finish(self) -> str:
        """At the end: the whole text."""
        self._flush()
        return self.text
