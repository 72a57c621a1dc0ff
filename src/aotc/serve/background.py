"""An ASGI app served by uvicorn on a free local port, in a thread of this process (serve
stage): what the server's tests and benchmarks/serve.py drive with real HTTP clients.

    with BackgroundServer(create_app(m)) as live:
        httpx.get(live.url + "/health")
"""
from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BackgroundServer:
    def __init__(self, app, start_timeout: float = 60.0):
        import uvicorn
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app, self.start_timeout = app, start_timeout
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="aotc-uvicorn",
                                       daemon=True)

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.__exit__()
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def engine(self):
        """The app's engine (aotc/serve/app.py)."""
        return self.app.state.server.engine
