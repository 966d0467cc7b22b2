"""A Reveille server with an OAuth MCP server: after ``reveille mcp login`` (a separate
process), ``serve`` finds the tokens in the store and a turn's tool call goes through with
them; no person, no second authorization."""

from __future__ import annotations

from pathlib import Path

from agent.providers.demo import DemoModel
from reveille.app import serve
from reveille.settings import Settings
from tests.api_server._support import DEMO_DELAY, KEY, RecordingProvider
from tests.api_server.test_runner import clean_state
from tests.mcp.oauth_server import oauth_echo
from tests.mcp.test_mcp_api import turn
from tests.mcp.test_oauth import _config, _home, _login
from tools.mcp.manager import mcp_clients

__all__ = ["clean_state"]  # the fixture, used by name


async def test_serve_calls_a_tool_with_the_logged_in_tokens(
    tmp_path: Path, clean_state: None
) -> None:
    async with oauth_echo() as (auth, url):
        env = _home(tmp_path, url)
        code, _, err = await _login(env)
        assert code == 0, err
        settings = Settings(
            home=tmp_path,
            port=0,
            webui_port=0,
            api_key=KEY,
            demo_delay_seconds=DEMO_DELAY,
            mcp_servers=(_config(env),),
        )
        async with serve(settings, provider=RecordingProvider(DemoModel(DEMO_DELAY))) as app:
            assert [s.state for s in mcp_clients.servers()] == ["ready"]
            reply, _ = await turn(app.adapter.port, 'call secure__say with {"text": "hi"}')
        assert reply == "secure__say returned: echo: hi"
        assert auth.grants == ["authorization_code"]
