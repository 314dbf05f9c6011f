"""The driver's links to the ranks of one torchrun world: each rank's control channel and
worker pid, and the loop that reads whichever rank speaks next. Every world built on
torchrun (one node, several, batched) holds one; nothing else touches the channels."""

from __future__ import annotations

import selectors
from collections.abc import Iterator

from harness.world.channel.messages import Message
from harness.world.channel.wire import Channel, ChannelClosed


class RankLinks:
    def __init__(self) -> None:
        self._channels: dict[int, Channel] = {}
        self._pids: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._channels)

    def add(self, rank: int, channel: Channel, pid: int) -> None:
        self._channels[rank], self._pids[rank] = channel, pid

    @property
    def pids(self) -> dict[int, int]:
        """Each connected rank's worker pid."""
        return dict(self._pids)

    def recv(self, rank: int, timeout_s: float) -> Message:
        """The rank's next message (ChannelClosed or TimeoutError when none comes)."""
        return self._channels[rank].recv(timeout_s=timeout_s)

    def ranks(self) -> Iterator[int]:
        return iter(list(self._channels))

    def send_to_all(self, message: Message) -> None:
        for channel in self._channels.values():
            try:
                channel.send(message)
            except ChannelClosed:
                pass  # a lost rank shows up in the collection loop

    def close(self) -> None:
        """Close every channel (a worker exits when its channel closes) and forget them."""
        for channel in self._channels.values():
            channel.close()
        self._channels, self._pids = {}, {}

    def inbox(self) -> Inbox:
        return Inbox(self._channels)


class Inbox:
    """Every rank's channel, read as messages arrive; a context manager."""

    def __init__(self, channels: dict[int, Channel]) -> None:
        self._selector = selectors.DefaultSelector()
        self._channels = dict(channels)
        for rank, channel in channels.items():
            self._selector.register(channel, selectors.EVENT_READ, rank)

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc_info) -> None:
        self._selector.close()

    def poll(self, timeout_s: float, recv_timeout_s: float
             ) -> list[tuple[int, Message | None]]:
        """(rank, message) for each rank that spoke within `timeout_s` (none: an empty
        list); a rank whose channel closed or stalled mid-message gives None, and is no
        longer read."""
        got = []
        for key, _ in self._selector.select(timeout=timeout_s):
            try:
                got.append((key.data, key.fileobj.recv(timeout_s=recv_timeout_s)))
            except (ChannelClosed, TimeoutError):
                self.drop(key.data)
                got.append((key.data, None))
        return got

    def drop(self, rank: int) -> None:
        """Read this rank no more."""
        self._selector.unregister(self._channels[rank])
