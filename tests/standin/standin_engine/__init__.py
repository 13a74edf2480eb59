"""A stand-in inference engine for tests: an OpenAI-compatible streaming server with vLLM's and
SGLang's side endpoints, pure standard library (asyncio), so it runs in any interpreter, such as
a bare `python -m venv --without-pip` environment that stands for an engine build's own env.

Run as `python -m standin_engine --port P [--model DIR] [--speculative-config JSON] ...`; other
engine flags are accepted and ignored. See `standin_engine.__main__` for what it answers.
"""

__version__ = "0.7.1+standin"
