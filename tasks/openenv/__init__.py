"""OpenEnv both ways: any `TaskSuite` served as an OpenEnv environment, and any OpenEnv
environment trained on as a suite (`suite: openenv`).

    python -m tasks.openenv serve --suite apptown --split dev --port 8000     # export
    python train.py --config configs/quickstart.yaml suite=openenv openenv.url=http://...:8000

Export (server.py, `__main__.py`): one WebSocket session per rollout, each with its own
sandbox from our pool (isolation unchanged); reset by task id or seed; a step is one code cell;
the episode ends when the agent calls `complete_task`, sends `submit`, or reaches the server's
step limit, and then our grader, on the server, gives the reward and the test report. The
agent's side sees observations and the final report only, never the grader or the state.
guard.py ends idle sessions, bounds the time a request's headers take, and checks the optional
bearer token (required when binding beyond the loopback).

Import (suite.py, env.py): tasks from the server's task list or from seeds, text cells through
our episode loop (token in, token out as with any suite), rewards from the environment
(`TestReport.external`, success only where the reward reaches `success_reward`), and a lost
session, a server error or a malformed field an infrastructure failure (excluded and counted,
never a 0). Its texts are cut to a bound before anything tokenises them.

The `openenv` package is an optional extra (`pip install -e .[openenv]`): only wire.py,
server.py and env.py import it (guard.py only uvicorn), and only when used; the rest of
`tasks/` never does.
"""
