"""The porting kit and the engine oracles: whether an implementation of the rules agrees with the spec.

- ``adapters``: the adapter protocol, the search for a counterexample, and the adapters that ship (kvspec's impl/).
- ``vectors`` and ``coverage``: the committed test vectors and the cases they must cover.
- ``runner``: `kvspec conform` (an adapter, vLLM's own code, SGLang's own code).
- ``vllm_oracle``, ``vllm_config``, ``vllm_lifecycle``: vLLM's own connector, configuration and scheduler code
  driven as oracles (in a vLLM venv); one ``Release`` entry per vLLM release.
- ``sglang_oracle``, ``sglang_code``: SGLang 0.5.23's own HiCache code from its unpacked wheel.
"""
